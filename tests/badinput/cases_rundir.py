"""Run directories, resume and metrics: a run dir another job holds (flock), `resume: auto` over checkpoints that
all fail verification, a bad explicit resume, a run dir or metrics file that cannot be used, and `gmod plot` on a
metrics file without a usable line. Interface: tests/badinput/run_corpus.py."""
import fcntl
import json
import os


def train_config(ctx, name, **top):
    cfg = {
        "model": {"path": os.path.join(ctx.root, "configs/demo_model"), "init": "random", "init_seed": 1},
        "data": {"train": os.path.join(ctx.demo_data, "train.json"),
                 "tokenizer": os.path.join(ctx.root, "tests/fixtures/tokenizer/sp/tokenizer.model"),
                 "max_len": 128, "workers": 0},
        "batch": {"micro_batch": 1, "global_batch": 2},
        "schedule": {"max_steps": 1},
        "run_dir": os.path.join(ctx.tmp, "run_" + name),
    }
    cfg.update(top)
    return ctx.write(name + ".config.json", json.dumps(cfg)), cfg["run_dir"]


def cases(ctx):
    c = []

    # --- a run dir in use: this process (the corpus runner) holds <run>/.lock with flock for as long as it runs,
    # as a live `gmod train` would; the descriptor is a plain int, so it stays open (and is not inherited by gmod).
    cfg, run = train_config(ctx, "locked")
    os.makedirs(run)
    fd = os.open(os.path.join(run, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"pid 777 on host corpus-host since 2026-01-01T00:00:00Z, user ci: gmod train (the corpus runner)\n")
    c.append(dict(name="train_run_dir_locked", argv=["train", "--config", cfg], timeout=30,
                  expect=r"run_dir .*run_locked is in use by another job \(pid 777 on host corpus-host since "
                         r"2026-01-01T00:00:00Z, .*lock file .*run_locked/\.lock\)"))

    # --- resume: auto with checkpoints present and none valid: refused, named; they are not trained over.
    cfg, run = train_config(ctx, "all_corrupt")
    ctx.write(os.path.join(run, "checkpoints/step-3/manifest.json"), "{not json")
    ctx.write(os.path.join(run, "checkpoints/step-5/model.h5"), b"\x00" * 64)  # no manifest
    c.append(dict(name="train_resume_auto_all_checkpoints_corrupt", argv=["train", "--config", cfg],
                  expect=r"resume: auto: .*run_all_corrupt/checkpoints has 2 checkpoint\(s\) and none is valid:\n  "
                         r".*step-5: no manifest\.json.*\n  .*step-3: unreadable manifest.*resume=auto_or_scratch"))
    bad = ctx.write("run_bad_explicit/checkpoints/step-1/manifest.json", '{"format": "gmod-checkpoint"}')
    cfg, _ = train_config(ctx, "bad_explicit", resume=os.path.dirname(bad))
    c.append(dict(name="train_resume_explicit_checkpoint_invalid", argv=["train", "--config", cfg],
                  expect=r"resume: checkpoint .*step-1 is not valid: unreadable manifest"))
    cfg, _ = train_config(ctx, "resume_word", resume="auto-or-scratch")
    c.append(dict(name="train_resume_unknown_word", argv=["train", "--config", cfg, "--dry-run"],
                  expect=r"resume: \"auto-or-scratch\" is neither auto, auto_or_scratch, none nor a checkpoint"))

    # --- a run dir or metrics file that cannot be used.
    not_dir = ctx.write("run_is_a_file", "x")
    cfg, _ = train_config(ctx, "run_file", run_dir=not_dir)
    c.append(dict(name="train_run_dir_is_a_file", argv=["train", "--config", cfg],
                  expect=r"run_dir: .*run_is_a_file is not a directory"))
    cfg, run = train_config(ctx, "metrics_dir")
    os.makedirs(os.path.join(run, "metrics.jsonl"))
    c.append(dict(name="train_metrics_jsonl_is_a_directory", argv=["train", "--config", cfg],
                  expect=r"metrics: cannot open .*run_metrics_dir/metrics\.jsonl.*: Is a directory"))

    # --- gmod plot: bad lines are skipped and reported; a file with no usable line is still an error.
    bad_lines = ctx.write("bad_metrics.jsonl", '{"step": 1, "lo\n[1, 2]\n{"loss": 3}\n')
    c.append(dict(name="plot_no_usable_line", argv=["plot", "--metrics", bad_lines, "--out", os.path.join(ctx.tmp, "p")],
                  expect=r"line 1: not JSON.*line 2: not a JSON object.*line 3: no numeric \"step\".*"
                         r"has no training step line \(3 bad line\(s\) skipped\)"))
    c.append(dict(name="plot_missing_file",
                  argv=["plot", "--metrics", os.path.join(ctx.tmp, "absent.jsonl"), "--out", os.path.join(ctx.tmp, "p2")],
                  expect=r"cannot read .*absent\.jsonl"))
    return c

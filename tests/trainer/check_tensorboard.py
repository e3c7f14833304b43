#!/usr/bin/env python3
"""metrics.tensorboard read back by TensorBoard's own reader (ctest tensorboard_events).

Runs `gmod train` on the demo config (4 steps, checkpoints at 2 and 4, evaluation at the end) with
metrics.tensorboard: true, then resumes the same run_dir from step-2 (steps 3 and 4 computed again). TensorBoard's
EventAccumulator (the package's reader: record CRCs checked, orphaned steps purged at a SessionLog START) must then
show every metrics.jsonl number of every step once, steps 1..4, with the values of the last computation, and the
evaluation scalars.

    python tests/trainer/check_tensorboard.py --gmod build/bin/gmod [--work DIR]
Exit 77 when the tensorboard package is missing (launch/setup.sh installs it).
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(gmod, run_dir, data_dir, extra):
    sets = ["model.path=configs/demo_model", f"run_dir={run_dir}", f"data.train={data_dir}/train.json",
            f"eval.data={data_dir}/heldout.json", "eval.max_batches=2", "data.demo_records=64",
            "batch.micro_batch=2", "batch.global_batch=4", "schedule.max_steps=4", "checkpoint.every=2",
            "checkpoint.keep_last=0", "metrics.log_every=1", "metrics.tensorboard=true", "mod.rule=keep_top:2",
            "deterministic=true"] + extra
    cmd = [gmod, "train", "--config", os.path.join(ROOT, "configs/demo.json"), "--threads", "1"]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gmod train failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"skipped: the tensorboard package is not installed ({e})")
        return 77
    work = args.work or tempfile.mkdtemp(prefix="gmod-tb-")
    run_dir, data_dir = os.path.join(work, "run"), os.path.join(work, "data")
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        out = train(args.gmod, run_dir, data_dir, ["resume=none"])
        assert "TensorBoard events in" in out, out[-2000:]
        first = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        train(args.gmod, run_dir, data_dir, [f"resume={run_dir}/checkpoints/step-2"])
        lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        steps = [l for l in lines if "eval" not in l]
        assert [l["step"] for l in steps] == [1, 2, 3, 4, 3, 4], [l["step"] for l in steps]
        last = {l["step"]: l for l in steps}  # the last computation of each step
        evals = [l for l in lines if "eval" in l]
        assert evals, "no evaluation line in metrics.jsonl"

        tb_dir = os.path.join(run_dir, "tensorboard")
        files = sorted(os.listdir(tb_dir))
        assert len(files) == 2 and all(f.startswith("events.out.tfevents.") for f in files), files
        acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        want = {"loss", "lm_loss", "routing_loss", "grad_norm", "lr", "tokens_per_s", "mfu", "step_s",
                "memory/rss_mb", "eval/loss"}
        assert want <= tags, f"missing tags: {sorted(want - tags)}"
        assert any(t.startswith("skip_ratio/") for t in tags), sorted(tags)

        def flat(j, prefix=""):
            for k, v in j.items():
                if isinstance(v, dict):
                    yield from flat(v, prefix + k + "/")
                elif isinstance(v, bool):
                    yield prefix + k, float(v)
                elif isinstance(v, (int, float)) and not (prefix == "" and k == "step"):
                    yield prefix + k, float(v)

        f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
        checked = 0
        for step, line in last.items():
            for tag, value in flat(line):
                events = [e for e in acc.Scalars(tag) if e.step == step]
                assert len(events) == 1, f"{tag} at step {step}: {len(events)} events (orphans not purged?)"
                assert events[0].value == f32(value) or (value != value and events[0].value != events[0].value), \
                    f"{tag} at step {step}: TensorBoard {events[0].value}, metrics.jsonl {value}"
                checked += 1
        assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4], [e.step for e in acc.Scalars("loss")]
        ev = evals[-1]
        for tag, value in flat(ev["eval"], "eval/"):
            got = [e for e in acc.Scalars(tag) if e.step == ev["step"]]
            assert got and got[-1].value == f32(value), f"{tag}: {got} vs {value}"
        # The resumed run recomputed steps 3-4 bitwise (deterministic): the first run's values are the same ones.
        assert all(a["loss"] == last[a["step"]]["loss"] for a in first if "eval" not in a)
        print(f"OK: {checked} scalars of {len(last)} steps and {len(flat_list(ev))} eval scalars read back by "
              f"TensorBoard's EventAccumulator from {len(files)} event files; orphaned steps purged on resume")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def flat_list(ev):
    return [k for k in ev["eval"] if isinstance(ev["eval"][k], (int, float))]


if __name__ == "__main__":
    sys.exit(main())

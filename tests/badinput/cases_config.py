"""Bad training configs and command-line values: integers beyond 32 bits (JSON and --set), NaN/inf floats, bad
devices, layer ranges beyond the model, settings beyond the model's positions, every problem of a file at once.
Interface: tests/badinput/run_corpus.py."""
import json
import os


def base_config(ctx, **sections):
    """A config `gmod train` accepts (checked by the case 'config_valid_dry_run'), with `sections` merged in."""
    cfg = {
        "model": {"path": os.path.join(ctx.root, "configs/demo_model"), "init": "random", "init_seed": 1},
        "data": {"train": os.path.join(ctx.demo_data, "train.json"),
                 "tokenizer": os.path.join(ctx.root, "tests/fixtures/tokenizer/sp/tokenizer.model"),
                 "max_len": 128, "workers": 0},
        "batch": {"micro_batch": 1, "global_batch": 2},
        "schedule": {"max_steps": 1},
        "run_dir": os.path.join(ctx.tmp, "run"),
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return cfg


def cases(ctx):
    c = []
    good = ctx.write("good.json", json.dumps(base_config(ctx)))

    def train_set(name, sets, expect, dry=True, **kw):
        argv = ["train", "--config", good] + (["--dry-run"] if dry else [])
        for s in sets:
            argv += ["--set", s]
        c.append(dict(name=name, argv=argv, expect=expect, **kw))

    def train_file(name, cfg_text, expect, dry=True, **kw):
        path = ctx.write(name + ".json", cfg_text if isinstance(cfg_text, str) else json.dumps(cfg_text))
        c.append(dict(name=name, argv=["train", "--config", path] + (["--dry-run"] if dry else []), expect=expect, **kw))

    # The base config itself is fine (so every case below fails for its own reason): --dry-run exits 0.
    c.append(dict(name="config_valid_dry_run", argv=["train", "--config", good, "--dry-run"], rc=0,
                  expect=r"effective config"))

    # --- 64-bit integers: named out-of-range errors instead of wrapping (4294967297 = 2^32 + 1 -> 1).
    train_set("set_micro_batch_2pow32_plus1", ["batch.micro_batch=4294967297"],
              r"batch\.micro_batch: 4294967297 is out of range.*\(from --set\)")
    train_set("set_max_len_2pow32_plus8", ["data.max_len=4294967304"], r"data\.max_len: 4294967304 is out of range")
    train_set("set_max_len_2pow32_plus8_no_dry_run", ["data.max_len=4294967304"],
              r"data\.max_len: 4294967304 is out of range", dry=False)
    train_set("set_integer_beyond_64_bits", ["batch.grad_accum=99999999999999999999"],
              r"--set batch\.grad_accum=99999999999999999999: cannot parse as integer \(out of range of a 64-bit")
    train_set("set_integer_hex", ["schedule.max_steps=0x10"], r"--set schedule\.max_steps=0x10: cannot parse as integer")
    train_set("set_negative_seed", ["seed=-1"], r"--set seed=-1: cannot parse .*non-negative")
    train_file("json_micro_batch_2pow32_plus1", base_config(ctx, batch={"micro_batch": 4294967297}),
               r"batch\.micro_batch: 4294967297 is out of range")
    train_file("json_negative_beyond_32_bits", base_config(ctx, checkpoint={"every": -4294967296}),
               r"checkpoint\.every: -4294967296 is out of range")
    train_file("json_mod_layers_idx_2pow32_plus1",
               base_config(ctx, mod={"enabled": True, "config": {"mod_layers_idx": [4294967297]}}),
               r"mod\.config\.mod_layers_idx\[0\]: 4294967297 is out of range")
    train_file("json_integer_as_float", base_config(ctx, data={"max_len": 128.5}),
               r"data\.max_len: expected integer, got number")
    train_file("json_seed_beyond_64_bits", base_config(ctx, seed=18446744073709551616),
               r"seed: expected integer, got number")

    # --- NaN and infinity: named, not "clipping off" / "guard off" / frozen weights.
    train_set("set_max_grad_norm_nan", ["optimizer.max_grad_norm=nan"],
              r"optimizer\.max_grad_norm: nan is not a finite number \(from --set\)")
    train_set("set_eps_inf", ["optimizer.eps=inf"], r"optimizer\.eps: inf is not a finite number")
    train_set("set_max_bad_fraction_nan", ["data.max_bad_fraction=nan"],
              r"data\.max_bad_fraction: nan is not a finite number")
    train_set("set_lr_minus_inf", ["optimizer.lr=-inf"], r"optimizer\.lr: -inf is not a finite number")
    train_set("set_skip_frac_nan", ["mod.config.skip_frac=nan"], r"mod\.config\.skip_frac: nan is not a finite")
    train_set("set_peak_tflops_nan_no_dry_run", ["metrics.peak_tflops=nan"], r"metrics\.peak_tflops: nan is not",
              dry=False)
    # 1e999 overflows a double: the JSON parser's error, or a non-finite value, but never accepted.
    train_file("json_lr_1e999", '{"optimizer": {"lr": 1e999}}', r"(lr: inf is not a finite number|not valid JSON)")
    train_set("set_beta1_nan", ["optimizer.beta1=nan"], r"optimizer\.beta1: nan is not a finite number")
    # These used to end later in a misleading "non-finite gradients" abort.
    train_set("set_lr_inf", ["optimizer.lr=inf"], r"optimizer\.lr: inf is not a finite number")
    train_set("set_weight_decay_nan_warmup_inf", ["optimizer.weight_decay=nan", "optimizer.warmup_ratio=inf"],
              r"(?=.*optimizer\.weight_decay: nan is not)(?=.*optimizer\.warmup_ratio: inf is not)")
    train_set("set_router_aux_loss_coef_inf", ["mod.enabled=true", "mod.config.router_aux_loss_coef=inf"],
              r"mod\.config\.router_aux_loss_coef: inf is not a finite number")

    # --- ranges and consistency.
    train_set("set_lr_zero", ["optimizer.lr=0"], r"optimizer\.lr: must be > 0")
    train_set("set_max_bad_fraction_2", ["data.max_bad_fraction=2"], r"data\.max_bad_fraction: must be in \[0, 1\]")
    train_set("set_workers_huge", ["data.workers=100000"], r"data\.workers: 100000, expected 0 to 256")
    train_set("set_prefetch_zero", ["data.prefetch=0"], r"data\.prefetch: 0, expected 1 to 4096")
    train_set("set_global_batch_not_multiple", ["batch.micro_batch=2", "batch.global_batch=3"],
              r"batch\.global_batch: 3 is not a multiple")
    train_set("set_samples_per_step_overflow",
              ["batch.global_batch=0", "batch.micro_batch=65536", "batch.grad_accum=65536"],
              r"batch\.grad_accum: .*samples per step is out of range")
    train_set("set_keep_last_one", ["checkpoint.keep_last=1"], r"checkpoint\.keep_last: 1")
    train_set("set_zero_stage_4", ["optimizer.zero_stage=4"], r"optimizer\.zero_stage: 4, expected 0, 1, 2 or 3")

    # --- model.device: cpu, cuda or cuda:N only.
    train_set("set_device_gpu", ["model.device=gpu"], r'model\.device: "gpu", expected cpu, cuda or cuda:N')
    train_set("set_device_cuda_letter", ["model.device=cuda:x"], r'model\.device: "cuda:x", expected')
    train_set("set_device_cuda_negative", ["model.device=cuda:-1"], r'model\.device: "cuda:-1", expected')
    train_set("set_device_cudax", ["model.device=cudax"], r'model\.device: "cudax", expected')

    # --- settings that must fit the model (configs/demo_model: 6 layers, 512 positions), before any allocation.
    train_set("freeze_range_to_int_max", ['freeze.llm_layers=["0-2147483647"]'],
              r"freeze\.llm_layers: layer range \"0-2147483647\": layer 2147483647 does not exist \(the model has 6",
              timeout=30)
    train_set("freeze_range_to_int_max_no_dry_run", ['freeze.llm_layers=["0-2147483647"]'],
              r"layer 2147483647 does not exist", dry=False, timeout=30)
    train_set("freeze_range_beyond_64_bits", ['freeze.llm_layers=["0-99999999999999999999"]'],
              r"layer range \"0-99999999999999999999\": expected", timeout=30)
    train_set("freeze_layer_6_of_6", ['freeze.llm_layers=["6"]'], r"layer 6 does not exist \(the model has 6 layers")
    train_set("freeze_range_reversed", ['freeze.llm_layers=["3-1"]'], r"layer range \"3-1\": expected")
    train_set("mod_layers_idx_beyond_model", ["mod.enabled=true", "mod.config.mod_layers_idx=[1,6]"],
              r"mod\.config\.mod_layers_idx\[1\]: layer 6 does not exist \(the model has 6 layers")
    train_set("mod_rule_layer_beyond_model", ["mod.enabled=true", "mod.rule=layers:1,2147483647"],
              r"mod\.rule: conversion rule layers:.*layer 2147483647 outside \[0, 6\)")
    train_set("max_len_beyond_positions", ["data.max_len=4096"],
              r"data\.max_len: 4096 is beyond the model's max_position_embeddings \(512")
    train_set("max_len_beyond_positions_no_dry_run", ["data.max_len=513"],
              r"data\.max_len: 513 is beyond the model's max_position_embeddings \(512", dry=False)

    # --- every problem of a file at once, each with its key.
    multi = base_config(ctx, batch={"micro_batch": 4294967297}, optimizer={"lr": -1, "zero_stage": 7},
                        data={"max_len": 4294967304, "workers": -1})
    multi["optimizr"] = {}
    # Reading problems (unknown key, out of range) and validation problems together, in one message naming the file;
    # the out-of-range max_len is not also reported as "beyond the model's positions" at its default.
    train_file("json_every_problem_at_once", multi,
               r"(?=.*json_every_problem_at_once\.json: invalid training config, 7 problem\(s\))"
               r"(?=.*optimizr: unknown key)(?=.*batch\.micro_batch: 4294967297)(?=.*data\.max_len: 4294967304)"
               r"(?=.*optimizer\.lr: must be > 0)(?=.*optimizer\.zero_stage: 7)(?=.*data\.workers: -1)"
               r"(?!.*data\.max_len: 2048)")
    multi2 = base_config(ctx, optimizer={"lr": -1, "zero_stage": 7, "eps": 0}, data={"workers": -1, "max_len": 9999},
                         model={"device": "tpu"})
    train_file("validation_every_problem_at_once", multi2,
               r"(?=.*invalid training config, \d+ problem\(s\))(?=.*model\.device: \"tpu\")(?=.*data\.max_len: 9999 is beyond)"
               r"(?=.*data\.workers: -1)(?=.*optimizer\.lr: must be > 0)(?=.*optimizer\.eps: must be > 0)"
               r"(?=.*optimizer\.zero_stage: 7)")
    train_file("json_not_an_object", "[1, 2]", r"config: expected an object, got array")
    train_file("json_truncated", '{"optimizer": {"lr": 0.1', r"not valid JSON")
    train_file("json_section_wrong_type", base_config(ctx, batch=3), r"batch: expected an object, got integer")
    train_set("set_unknown_key", ["optimizer.learning_rate=1"], r"--set optimizer\.learning_rate: unknown key")
    train_set("set_bool_yes", ["deterministic=yes"], r"--set deterministic=yes: cannot parse as boolean")
    train_set("set_zero3_reshard_not_bool", ["optimizer.zero3_reshard_after_forward=sometimes"],
              r"--set optimizer\.zero3_reshard_after_forward=sometimes: cannot parse as boolean")
    train_set("set_section", ["optimizer=1"], r"--set optimizer: is a section")
    c.append(dict(name="train_missing_config", argv=["train", "--config", os.path.join(ctx.tmp, "nope.json")],
                  expect=r"cannot open config file .*nope\.json"))

    # --- command-line values: typed, range-checked, finite.
    for cmd in (["train", "--config", good, "--dry-run"], ["forward"], ["data", "check", "x.json"]):
        opt = "--workers" if cmd[0] == "data" else "--threads"
        c.append(dict(name=f"{cmd[0]}_{opt[2:]}_abc", argv=cmd + [opt, "abc"], rc=2,
                      expect=rf"{opt}: 'abc' is not an integer"))
    c.append(dict(name="forward_threads_huge", argv=["forward", "--threads", "100000"], rc=2,
                  expect=r"--threads: must be in \[0, 1024\], not 100000"))
    c.append(dict(name="train_threads_huge", argv=["train", "--config", good, "--threads", "4294967297"], rc=2,
                  expect=r"--threads: '4294967297' is out of range"))
    c.append(dict(name="data_check_workers_huge", argv=["data", "check", "x.json", "--workers", "1000000"], rc=2,
                  expect=r"--workers: must be in \[1, 256\]"))
    c.append(dict(name="forward_steps_nan", argv=["forward", "--steps", "nan"], rc=2,
                  expect=r"--steps: 'nan' is not an integer"))
    c.append(dict(name="forward_check_reference_nan", argv=["forward", "--check-reference", "nan"], rc=2,
                  expect=r"--check-reference: 'nan' is not a finite number"))
    c.append(dict(name="plan_gpu_mem_inf", argv=["plan", "configs/demo.json", "--gpu-mem", "inf"], rc=2,
                  expect=r"--gpu-mem: 'inf' is not a finite number"))
    c.append(dict(name="plan_mod_kept_nan", argv=["plan", "configs/demo.json", "--mod-kept", "nan"], rc=2,
                  expect=r"--mod-kept: 'nan' is not a finite number"))
    c.append(dict(name="convert_skip_frac_nan",
                  argv=["convert", "--model", "tests/fixtures/hf/llava_layer_m2", "--out", os.path.join(ctx.tmp, "cv"),
                        "--skip-frac", "nan"], rc=2, expect=r"--skip-frac: 'nan' is not a finite number"))
    c.append(dict(name="data_demo_image_size_huge",
                  argv=["data", "demo", "--out", os.path.join(ctx.tmp, "dd"), "--image-size", "4294967297"], rc=2,
                  expect=r"--image-size: '4294967297' is out of range"))

    # --- gmod plan reads the same config through the same checks.
    c.append(dict(name="plan_micro_batch_2pow32_plus1",
                  argv=["plan", "configs/demo.json", "--set", "batch.micro_batch=4294967297"],
                  expect=r"batch\.micro_batch: 4294967297 is out of range"))
    c.append(dict(name="plan_max_len_beyond_positions", argv=["plan", "configs/demo.json", "--set", "data.max_len=100000"],
                  expect=r"data\.max_len: 100000 is beyond the model's max_position_embeddings \(512"))
    c.append(dict(name="plan_freeze_range_to_int_max", timeout=30,
                  argv=["plan", "configs/demo.json", "--set", 'freeze.llm_layers=["0-2147483647"]'],
                  expect=r"layer 2147483647 does not exist \(the model has 6 layers"))
    c.append(dict(name="plan_eps_nan", argv=["plan", "configs/demo.json", "--set", "optimizer.eps=nan"],
                  expect=r"optimizer\.eps: nan is not a finite number"))
    # --- issue 34: a LoRA rank beyond a layer's width is named before any adapter is allocated (it used to die in the
    # allocator asking for 512 GiB); a profile range that is not A-B with 1 <= A <= B is named.
    train_set("train_lora_r_beyond_width", ["lora.r=1000000", f"run_dir={ctx.tmp}/run-lora"],
              r"lora\.r: 1000000 exceeds the width of .*a LoRA rank is at most min\(out, in\)", dry=False,
              timeout=120)
    train_set("config_profile_steps_reversed", ["metrics.profile_steps=3-2"],
              r'metrics\.profile_steps: "3-2" must have 1 <= A <= B')
    train_set("config_profile_steps_not_a_range", ["metrics.profile_steps=two"],
              r'metrics\.profile_steps: "two" is not A-B')
    return c

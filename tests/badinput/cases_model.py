"""Bad model configs (Hugging Face config.json of LLaMA, LLaVA and its CLIP tower) through every command that
loads one, option values beyond the model (--seq, --max-len, --max-new-tokens), and the messages that used to
mislead: a tampered checkpoint manifest world_size, exporting NaN weights. Interface: tests/badinput/run_corpus.py."""
import json
import os
import shutil
import struct
import subprocess

TOKENIZER = "tests/fixtures/tokenizer/sp/tokenizer.model"


def demo_model_config(ctx):
    with open(os.path.join(ctx.root, "configs/demo_model/config.json")) as f:
        return json.load(f)


def bad_model(ctx, name, mutate):
    """configs/demo_model's config.json (LLaVA: text_config + vision_config) changed by `mutate`, in its own dir."""
    cfg = demo_model_config(ctx)
    mutate(cfg)
    ctx.write(f"models/{name}/config.json", json.dumps(cfg, indent=1))
    return os.path.join(ctx.tmp, "models", name)


def set_key(section, key, value):
    def mutate(cfg):
        (cfg if section is None else cfg[section])[key] = value
    return mutate


def nan_weights_copy(ctx):
    """tests/fixtures/hf/llava_layer_m2 with the first float32 tensor's first element set to NaN."""
    src = os.path.join(ctx.root, "tests/fixtures/hf/llava_layer_m2")
    dst = os.path.join(ctx.tmp, "nan_model")
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        name = sorted(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")[0]
        f.seek(8 + n + header[name]["data_offsets"][0])
        f.write(struct.pack("<I", 0x7FC00000))  # a quiet NaN
    return dst, name


def train_checkpoint(ctx):
    """One optimizer step of the demo model on the demo data with a checkpoint at the end: RUN/checkpoints/step-1."""
    run = os.path.join(ctx.tmp, "ckpt_run")
    cfg = {
        "model": {"path": os.path.join(ctx.root, "configs/demo_model"), "init": "random", "init_seed": 1},
        "data": {"train": os.path.join(ctx.demo_data, "train.json"),
                 "tokenizer": os.path.join(ctx.root, TOKENIZER), "max_len": 96, "workers": 0},
        "batch": {"micro_batch": 1, "global_batch": 1},
        "schedule": {"max_steps": 1},
        "run_dir": run,
    }
    path = ctx.write("ckpt_run.json", json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([ctx.gmod, "train", "--threads", "1", "--config", path], cwd=ctx.root, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    step = os.path.join(run, "checkpoints", "step-1")
    if r.returncode != 0 or not os.path.isfile(os.path.join(step, "manifest.json")):
        raise RuntimeError("cases_model: the checkpoint run failed:\n" + r.stdout.decode()[-3000:])
    return path, step


def tampered_copy(ctx, step, name, world_size):
    dst = os.path.join(ctx.tmp, name, "checkpoints", "step-1")
    shutil.copytree(step, dst)
    mpath = os.path.join(dst, "manifest.json")
    with open(mpath) as f:
        m = json.load(f)
    m["world_size"] = world_size
    with open(mpath, "w") as f:
        json.dump(m, f)
    return dst


def cases(ctx):
    c = []
    tok = os.path.join(ctx.root, TOKENIZER)
    data = os.path.join(ctx.demo_data, "train.json")

    def through(name, model_dir, expect, cmds=("forward", "eval", "convert", "export", "arank", "generate")):
        """The bad model dir through each command that loads a model config."""
        out = os.path.join(ctx.tmp, "out", name)
        argv = {
            "forward": ["forward", "--model", model_dir, "--steps", "1", "--seq", "8"],
            "eval": ["eval", "--model", model_dir, "--random-init", "1", "--data", data, "--tokenizer", tok,
                     "--max-batches", "1", "--no-exact-match"],
            "convert": ["convert", "--model", model_dir, "--out", out + "_convert", "--rule", "layers:1"],
            "export": ["export", "--from-hf", model_dir, "--out", out + "_export"],
            "arank": ["arank", "--model", model_dir, "--random-init", "1", "--data", data, "--tokenizer", tok,
                      "--samples", "2"],
            "generate": ["generate", "--model", model_dir, "--random-init", "1", "--tokenizer", tok,
                         "--prompt", "hi", "--max-new-tokens", "2"],
        }
        for cmd in cmds:
            c.append(dict(name=f"{name}_{cmd}", argv=argv[cmd], rc=1, expect=expect))

    # --- integers beyond 32 bits, wrong types.
    through("model_layers_2pow32_plus6",
            bad_model(ctx, "layers_big", set_key("text_config", "num_hidden_layers", 4294967302)),
            r"text_config: field 'num_hidden_layers' is out of range: 4294967302", cmds=("forward", "eval", "export"))
    through("model_vocab_string", bad_model(ctx, "vocab_str", set_key("text_config", "vocab_size", "big")),
            r"field 'vocab_size' has the wrong type \(string", cmds=("forward",))
    through("model_layers_float", bad_model(ctx, "layers_float", set_key("text_config", "num_hidden_layers", 2.5)),
            r"field 'num_hidden_layers' has the wrong type \(number", cmds=("forward",))
    through("model_tie_embeddings_int", bad_model(ctx, "tie_int", set_key("text_config", "tie_word_embeddings", 1)),
            r"field 'tie_word_embeddings' has the wrong type", cmds=("forward",))
    through("model_mod_yes_please", bad_model(ctx, "mod_str", set_key(None, "mod", "yes please")),
            r"field 'mod' has the wrong type \(string", cmds=("forward", "eval", "export"))
    through("model_mod_layers_idx_beyond", bad_model(ctx, "mod_idx", set_key(None, "mod_layers_idx", [3, 4294967297])),
            r"field 'mod_layers_idx' must be a list of layer indices", cmds=("forward",))
    through("model_mod_object_layers_2pow32_plus1",
            bad_model(ctx, "mod_obj_idx", set_key(None, "mod", {"mod_enable": True, "mod_layers_idx": [4294967297]})),
            r"field 'mod\.mod_layers_idx' must be a list of layer indices .* got \[4294967297\]",
            cmds=("forward", "export"))

    # --- gmod's own "mod" object is checked whole: a misspelt key used to be ignored and the model ran dense
    # (--random-init in eval/arank/generate, gmod train's model.path, and any object with mod_enable false).
    unknown = r'config\.json: "mod": unknown MoD config key "skip_fracc"'
    through("model_mod_unknown_key",
            bad_model(ctx, "mod_unknown", set_key(None, "mod", {"mod_enable": True, "mod_layers_idx": [1],
                                                                 "skip_fracc": 0.9})), unknown)
    through("model_mod_disabled_unknown_key",
            bad_model(ctx, "mod_off_unknown", set_key(None, "mod", {"mod_enable": False, "skip_fracc": 0.9})),
            unknown, cmds=("forward", "eval", "generate", "convert"))
    for name, mod, expect in (
            ("train_model_mod_unknown_key", {"mod_enable": True, "mod_layers_idx": [1], "skip_fracc": 0.9}, unknown),
            ("train_model_is_gamma_mod", {"mod_enable": True, "mod_layers_idx": [1, 2]},
             r'config\.json is a γ-MoD model \("mod": 2 MoD layers\); gmod train starts from a dense model')):
        mcfg = {"model": {"path": bad_model(ctx, name, set_key(None, "mod", mod)), "init": "random"},
                "data": {"train": data, "tokenizer": tok, "max_len": 64, "workers": 0},
                "run_dir": os.path.join(ctx.tmp, "run_" + name)}
        c.append(dict(name=name, argv=["train", "--config", ctx.write(name + ".json", json.dumps(mcfg))],
                      expect=r"model: .*" + expect))

    # --- values that cannot be right.
    through("model_rms_norm_eps_negative", bad_model(ctx, "eps_neg", set_key("text_config", "rms_norm_eps", -1)),
            r"'rms_norm_eps' must be positive, got -1", cmds=("forward", "eval", "convert"))
    through("model_head_dim_negative", bad_model(ctx, "head_dim_neg", set_key("text_config", "head_dim", -2)),
            r"'head_dim' must be positive, got -2", cmds=("forward", "eval"))
    through("model_positions_zero",
            bad_model(ctx, "pos_zero", set_key("text_config", "max_position_embeddings", 0)),
            r"'max_position_embeddings' must be positive, got 0", cmds=("forward", "eval", "generate"))
    through("model_rope_theta_zero",
            bad_model(ctx, "theta_zero", lambda cfg: cfg["text_config"]["rope_parameters"].update(rope_theta=0)),
            r"'rope_theta' must be positive", cmds=("forward",))
    through("model_kv_heads_not_dividing",
            bad_model(ctx, "kv_heads", set_key("text_config", "num_key_value_heads", 3)),
            r"num_attention_heads \(\d+\) is not a multiple of num_key_value_heads \(3\)", cmds=("forward", "eval"))
    through("model_heads_not_dividing_hidden",
            bad_model(ctx, "heads_hidden", lambda cfg: cfg["text_config"].update(
                num_attention_heads=7, num_key_value_heads=7, head_dim=None)),
            r"hidden_size \(\d+\) is not a multiple of num_attention_heads \(7\)", cmds=("forward",))
    through("model_heads_zero", bad_model(ctx, "heads_zero", set_key("text_config", "num_attention_heads", 0)),
            r"'num_attention_heads' must be positive", cmds=("forward", "eval"))
    through("model_intermediate_negative",
            bad_model(ctx, "inter_neg", set_key("text_config", "intermediate_size", -5)),
            r"'intermediate_size' must be positive", cmds=("forward",))
    through("model_eos_outside_vocab", bad_model(ctx, "eos_big", set_key("text_config", "eos_token_id", 999999)),
            r"'eos_token_id' 999999 is outside the vocabulary", cmds=("generate",))

    # --- the CLIP tower: heads 0 used to be SIGFPE in forward/eval/convert/export.
    through("vision_heads_zero", bad_model(ctx, "vheads_zero", set_key("vision_config", "num_attention_heads", 0)),
            r"vision_config: 'num_attention_heads' must be positive, got 0")
    through("vision_heads_not_dividing",
            bad_model(ctx, "vheads_div", set_key("vision_config", "num_attention_heads", 5)),
            r"vision hidden_size \(\d+\) is not a multiple of num_attention_heads \(5\)", cmds=("forward", "export"))
    through("vision_patch_not_dividing", bad_model(ctx, "vpatch", set_key("vision_config", "patch_size", 5)),
            r"image_size \(16\) is not a multiple of patch_size \(5\)", cmds=("forward", "eval"))
    through("vision_patch_zero", bad_model(ctx, "vpatch0", set_key("vision_config", "patch_size", 0)),
            r"'patch_size' must be positive", cmds=("forward",))
    through("vision_layer_norm_eps_zero", bad_model(ctx, "vlneps", set_key("vision_config", "layer_norm_eps", 0)),
            r"vision_config: 'layer_norm_eps' must be positive", cmds=("forward",))
    through("vision_image_tokens_beyond_positions",
            bad_model(ctx, "vimg_big", set_key("vision_config", "image_size", 4096)),
            r"one image takes 1024\^2 positions, not fewer than max_position_embeddings \(512\)", cmds=("forward",))

    # --- every problem of the file at once, each naming the file and key.
    def many(cfg):
        cfg["text_config"].update(rms_norm_eps=-1, head_dim=-2, max_position_embeddings=0)
        cfg["vision_config"]["num_attention_heads"] = 0
        cfg["mod"] = "yes please"
    through("model_every_problem_at_once", bad_model(ctx, "many", many),
            r"(?=.*invalid model config \(5 problems\))(?=.*many/config\.json: text_config: 'rms_norm_eps')"
            r"(?=.*many/config\.json: text_config: 'head_dim')(?=.*'max_position_embeddings' must be positive)"
            r"(?=.*many/config\.json: vision_config: 'num_attention_heads')(?=.*field 'mod' has the wrong type)",
            cmds=("forward", "eval"))

    # --- a bad model config through gmod train (its check reads the model's config.json before anything else).
    train_cfg = {
        "model": {"path": bad_model(ctx, "train_vheads", set_key("vision_config", "num_attention_heads", 0)),
                  "init": "random"},
        "data": {"train": data, "tokenizer": tok, "max_len": 64, "workers": 0},
        "run_dir": os.path.join(ctx.tmp, "run_bad_model"),
    }
    c.append(dict(name="train_vision_heads_zero", argv=["train", "--config", ctx.write("train_bad.json", json.dumps(train_cfg))],
                  expect=r"model: invalid model config.*'num_attention_heads' must be positive"))

    # --- options beyond the model's positions (configs/demo_model: 512).
    c.append(dict(name="forward_seq_beyond_positions", rc=2,
                  argv=["forward", "--model", "configs/demo_model", "--seq", "4096"],
                  expect=r"--seq 4096 is beyond the model's max_position_embeddings \(512"))
    c.append(dict(name="forward_seq_513_beyond_512", rc=2,
                  argv=["forward", "--model", bad_model(ctx, "no_ref", lambda cfg: None), "--seq", "513"],
                  expect=r"--seq 513 is beyond the model's max_position_embeddings \(512"))
    c.append(dict(name="eval_max_len_beyond_positions", rc=2,
                  argv=["eval", "--model", "configs/demo_model", "--random-init", "1", "--data", data,
                        "--tokenizer", tok, "--max-len", "100000"],
                  expect=r"--max-len 100000 is beyond the model's max_position_embeddings \(512"))
    c.append(dict(name="arank_max_len_beyond_positions", rc=2,
                  argv=["arank", "--model", "configs/demo_model", "--random-init", "1", "--data", data,
                        "--tokenizer", tok, "--max-len", "513"],
                  expect=r"--max-len 513 is beyond the model's max_position_embeddings"))
    c.append(dict(name="generate_new_tokens_beyond_positions", rc=2,
                  argv=["generate", "--model", "configs/demo_model", "--random-init", "1", "--tokenizer", tok,
                        "--prompt", "hi", "--max-new-tokens", "100000"],
                  expect=r"--max-new-tokens 100000: the prompt .* beyond the model's max_position_embeddings \(512"))
    c.append(dict(name="generate_temperature_inf", rc=2,
                  argv=["generate", "--model", "configs/demo_model", "--random-init", "1", "--tokenizer", tok,
                        "--temperature", "inf"],
                  expect=r"--temperature: 'inf' is not a finite number"))
    c.append(dict(name="generate_top_p_zero",
                  argv=["generate", "--model", "configs/demo_model", "--random-init", "1", "--tokenizer", tok,
                        "--prompt", "hi", "--top-p", "0"],
                  expect=r"--top-p 0\.0+: must be in \(0, 1\]"))
    c.append(dict(name="generate_temperature_zero",
                  argv=["generate", "--model", "configs/demo_model", "--random-init", "1", "--tokenizer", tok,
                        "--prompt", "hi", "--temperature", "0"],
                  expect=r"--temperature: must be > 0, not 0"))
    c.append(dict(name="eval_mod_layer_beyond_model",
                  argv=["eval", "--model", "configs/demo_model", "--random-init", "1", "--data", data,
                        "--tokenizer", tok, "--mod", "layers:2147483647"],
                  expect=r"layer 2147483647 outside \[0, 6\)"))

    # --- inference routing rules (docs/mod.md): FastV and adaptive thresholds, from config.json and options.
    through("model_mod_fastv_k_zero",
            bad_model(ctx, "fastv_k0", set_key(None, "mod", {"router": "fastv", "fastv_k": 0, "fastv_r": 0.5,
                                                             "mod_layers_idx": [0, 1, 2, 3, 4, 5],
                                                             "rope_positions": "original"})),
            r'config\.json: "mod": invalid MoD config:.*fastv_k = 0, expected \[1, 6\)', cmds=("eval", "generate"))
    through("model_mod_fastv_r_above_one",
            bad_model(ctx, "fastv_r", set_key(None, "mod", {"router": "fastv", "fastv_k": 2, "fastv_r": 1.5,
                                                            "mod_layers_idx": [2, 3, 4, 5],
                                                            "rope_positions": "original"})),
            r'config\.json: "mod": invalid MoD config:.*fastv_r = 1\.5, expected \[0, 1\]', cmds=("eval", "generate"))
    through("model_mod_adaptive_seqlen_without_avg",
            bad_model(ctx, "adaptive_seqlen", set_key(None, "mod", {"mod_layers_idx": [2, 3],
                                                                    "adaptive_threshold": "seqlen"})),
            r'config\.json: "mod": invalid MoD config:.*adaptive_threshold "seqlen" needs avg_seqlen > 0',
            cmds=("eval", "generate"))
    through("model_mod_adaptive_unknown",
            bad_model(ctx, "adaptive_log", set_key(None, "mod", {"mod_layers_idx": [2], "adaptive_threshold": "log"})),
            r'config\.json: "mod": adaptive_threshold = "log", expected one of none, seqlen, arank',
            cmds=("eval", "generate"))
    c.append(dict(name="generate_fastv_k_beyond_layers", rc=2,
                  argv=["generate", "--model", "configs/demo_model", "--random-init", "1", "--tokenizer", tok,
                        "--prompt", "hi", "--fastv", "6:0.5"],
                  expect=r"--fastv: .*fastv_k = 6, expected \[1, 6\)"))
    c.append(dict(name="eval_fastv_not_k_colon_r", rc=2,
                  argv=["eval", "--model", "configs/demo_model", "--random-init", "1", "--data", data,
                        "--tokenizer", tok, "--fastv", "half"],
                  expect=r'--fastv: FastV "half": expected K:R'))
    c.append(dict(name="convert_fastv_rule_bad_ratio", rc=2,
                  argv=["convert", "--model", "configs/demo_model", "--out", os.path.join(ctx.tmp, "fastv_conv"),
                        "--rule", "fastv:2:x"],
                  expect=r'--rule FastV "2:x": expected K:R'))

    # --- the misleading messages: NaN weights, tampered manifest world_size.
    nan_dir, nan_tensor = nan_weights_copy(ctx)
    c.append(dict(name="export_nan_weights", argv=["export", "--from-hf", nan_dir, "--out", os.path.join(ctx.tmp, "nan_out")],
                  expect=r"the weights are non-finite in 1 tensor\(s\), nothing exported:\s+\S+ \(1 NaN, 0 inf"))
    # gmod convert used to write the NaN into its γ-MoD dir; every command that writes weights checks them.
    c.append(dict(name="convert_nan_weights",
                  argv=["convert", "--model", nan_dir, "--out", os.path.join(ctx.tmp, "nan_conv"), "--rule", "layers:1"],
                  expect=r"nan_model: the weights are non-finite in 1 tensor\(s\), nothing converted:\s+\S+ \(1 NaN, 0 inf"))
    train_json, step = train_checkpoint(ctx)
    for world, expect in ((2, r"manifest\.json is inconsistent: world_size 2 but it lists the optimizer files of 1 rank"),
                          (0, r"manifest\.json world_size 0 is not a rank count"),
                          (4294967297, r"manifest\.json world_size 4294967297 is not a rank count")):
        d = tampered_copy(ctx, step, f"tampered_{world}", world)
        c.append(dict(name=f"export_manifest_world_size_{world}", argv=["export", "--checkpoint", d, "--out",
                                                                       os.path.join(ctx.tmp, f"tout_{world}")],
                      expect=r"is not valid: " + expect))
        c.append(dict(name=f"train_resume_manifest_world_size_{world}",
                      argv=["train", "--config", train_json, "--set", "resume=" + d, "--set",
                            "run_dir=" + os.path.join(ctx.tmp, f"resume_run_{world}")],
                      expect=r"resume: checkpoint .* is not valid: " + expect))
    return c

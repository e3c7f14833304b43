#!/usr/bin/env python3
"""gmod's LoRA against PEFT itself (the `peft` package on transformers' models), both directions.

1. PEFT -> gmod: PEFT puts random adapters (init_lora_weights=False: B is not zero) on the tiny LLaMA fixture and
   saves them (safetensors, and adapter_model.bin as PEFT writes it with safe_serialization=False); gmod applies
   them unmerged (bench_logits MODEL INPUTS OUT ADAPTER) and merges them
   (`gmod merge`): gmod's logits, transformers' logits of gmod's merged dir and gmod's logits of it all match the
   PeftModel's within 1e-4, and the merged weights match PEFT's merge_and_unload.
2. gmod -> PEFT: a LoRA run of `gmod train` (the tiny demo LLaVA, dense, 2 steps) exported with `gmod export`;
   transformers' LlavaForConditionalGeneration of the base plus PeftModel.from_pretrained(<export>/adapter) gives
   gmod's logits (bench_logits with the adapter) within 1e-4, and differs from the base's.

    python tests/model/check_lora_peft.py --gmod build/bin/gmod --bench-logits build/bench/bench_logits \
        --workdir /tmp/lora-peft

Exits 77 (ctest SKIP_RETURN_CODE) when transformers or peft is not installed (launch/setup.sh installs both).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM, LlavaForConditionalGeneration
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    print(out.stdout.strip()[-3000:])
    if out.returncode != 0:
        print(out.stderr[-3000:])
        raise SystemExit(f"FAIL: {cmd[0]} exited {out.returncode}")
    return out.stdout


def gmod_logits(args, model_dir, inputs, adapter=None):
    out = inputs.replace(".safetensors", "-gmod.safetensors")
    run([args.bench_logits, model_dir, inputs, out] + ([adapter] if adapter else []))
    return load_file(out)["logits"]


def check_close(what, got, want):
    d = (got - want).abs().max().item()
    print(f"{what}: max |diff| {d:.3g}")
    if not d < TOL:
        raise SystemExit(f"FAIL: {what}: max |diff| {d} >= {TOL}")


def peft_to_gmod(args):
    w = os.path.join(args.workdir, "peft_to_gmod")
    os.makedirs(w)
    base = os.path.join(ROOT, "tests/fixtures/hf/llama_untied_gqa")
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    cfg = LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0, init_lora_weights=False,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(model, cfg).eval()
    adapter = os.path.join(w, "adapter")
    pm.save_pretrained(adapter)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 11), generator=torch.Generator().manual_seed(1))
    inputs = os.path.join(w, "inputs.safetensors")
    save_file({"input_ids": ids}, inputs)
    with torch.no_grad():
        want = pm(input_ids=ids).logits.float()
        with pm.disable_adapter():
            plain = pm(input_ids=ids).logits.float()
    if not (want - plain).abs().max().item() > 1e-3:
        raise SystemExit("FAIL: PEFT's random adapters do not change the logits (the check would be vacuous)")
    check_close("gmod + PEFT adapter (unmerged) vs PeftModel", gmod_logits(args, base, inputs, adapter), want)
    # The same adapter as PEFT writes it with safe_serialization=False (adapter_model.bin, torch.save).
    adapter_bin = os.path.join(w, "adapter_bin")
    pm.save_pretrained(adapter_bin, safe_serialization=False)
    if not os.path.exists(os.path.join(adapter_bin, "adapter_model.bin")):
        raise SystemExit("FAIL: PEFT did not write adapter_model.bin")
    check_close("gmod + PEFT adapter_model.bin (unmerged) vs PeftModel", gmod_logits(args, base, inputs, adapter_bin),
                want)

    merged = os.path.join(w, "merged")
    run([args.gmod, "merge", "--model", base, "--adapter", adapter, "--out", merged])
    check_close("gmod of `gmod merge` vs PeftModel", gmod_logits(args, merged, inputs), want)
    tm = LlamaForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    with torch.no_grad():
        check_close("transformers of `gmod merge` vs PeftModel", tm(input_ids=ids).logits.float(), want)
    ref = pm.merge_and_unload().state_dict()
    got = tm.state_dict()
    for k in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        check_close(f"merged {k} vs merge_and_unload", got[k], ref[k])


def gmod_to_peft(args):
    w = os.path.join(args.workdir, "gmod_to_peft")
    os.makedirs(w)
    run_dir = os.path.join(w, "run")
    cfg = {
        "model": {"path": os.path.join(ROOT, "configs/demo_model"), "init": "random", "init_seed": 3},
        "data": {"train": os.path.join(w, "data/train.json"), "demo_records": 16, "max_len": 128, "workers": 0,
                 "tokenizer": os.path.join(ROOT, "tests/fixtures/tokenizer/sp/tokenizer.model")},
        "optimizer": {"lr": 1e-2, "warmup_steps": 0, "warmup_ratio": 0.0, "zero_stage": 0},
        "batch": {"micro_batch": 2, "global_batch": 4},
        "schedule": {"max_steps": 2},
        "eval": {"exact_match": False},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.05, "targets": ["all-linear"]},
        "seed": 5, "deterministic": True, "run_dir": run_dir, "resume": "none",
    }
    cfg_path = os.path.join(w, "lora.json")
    json.dump(cfg, open(cfg_path, "w"))
    run([args.gmod, "train", "--threads", "1", "--config", cfg_path])
    out = os.path.join(w, "export")
    run([args.gmod, "export", "--checkpoint", run_dir, "--out", out])
    adapter = os.path.join(out, "adapter")
    model = LlavaForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    vocab = model.config.text_config.vocab_size
    ids = torch.randint(3, vocab - 1, (2, 13), generator=torch.Generator().manual_seed(2))
    ids[ids == model.config.image_token_index] = 3  # text only
    inputs = os.path.join(w, "inputs.safetensors")
    save_file({"input_ids": ids}, inputs)
    with torch.no_grad():
        plain = model(input_ids=ids).logits.float()
    pm = PeftModel.from_pretrained(model, adapter).eval()
    n = sum(1 for k, _ in pm.named_parameters() if "lora_B" in k)
    print(f"PEFT adapted {n} modules")
    with torch.no_grad():
        want = pm(input_ids=ids).logits.float()
    if not (want - plain).abs().max().item() > 1e-4:
        raise SystemExit("FAIL: the trained adapter does not change the logits (the check would be vacuous)")
    check_close("PeftModel of gmod's export vs gmod + adapter", want, gmod_logits(args, out, inputs, adapter))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--bench-logits", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    if os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    peft_to_gmod(args)
    gmod_to_peft(args)
    print("lora_peft: PASS")


if __name__ == "__main__":
    main()

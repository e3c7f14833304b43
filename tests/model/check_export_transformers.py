#!/usr/bin/env python3
"""gmod's Hugging Face export loads in transformers and gives the same logits.

Exports the tiny LLaVA fixture with `gmod export --from-hf` (save_mod_pretrained, dense), loads the result
with transformers' LlavaForConditionalGeneration and compares its logits on random text ids with gmod's
(build/bench/bench_logits) within 1e-4. Also converts the fixture to γ-MoD with `gmod convert` and checks that
transformers still loads the dense part of that directory (the router tensors are extra keys to it).

    python tests/model/check_export_transformers.py --gmod build/bin/gmod --bench-logits build/bench/bench_logits \
        --workdir /tmp/export-check

Exits 77 (ctest SKIP_RETURN_CODE) when transformers is not installed (CI's venv has none).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import transformers  # noqa: F401
    from safetensors.torch import load_file, save_file
    from transformers import LlavaForConditionalGeneration
except ImportError as e:  # CI's venv has no transformers
    print(f"skipping: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    print(out.stdout.strip())
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--bench-logits", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "tests/fixtures/hf/llava_layer_m2"))
    args = ap.parse_args()
    if os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    dense = os.path.join(args.workdir, "dense")
    run([args.gmod, "export", "--from-hf", args.model, "--out", dense])
    cfg = json.load(open(os.path.join(dense, "config.json")))
    assert "mod" not in cfg, "a dense export must not carry a mod config"

    model = LlavaForConditionalGeneration.from_pretrained(dense, dtype=torch.float32)
    model.eval()
    vocab = model.config.text_config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab - 1, (2, 24), generator=g)
    ids[ids == model.config.image_token_index] = 3  # text only
    inputs = os.path.join(args.workdir, "inputs.safetensors")
    out = os.path.join(args.workdir, "logits.safetensors")
    save_file({"input_ids": ids.contiguous()}, inputs)
    run([args.bench_logits, dense, inputs, out])
    ours = load_file(out)["logits"]
    with torch.no_grad():
        theirs = model(input_ids=ids).logits.float()
    diff = (ours - theirs).abs().max().item()
    print(f"dense export: max |logits gmod - transformers| = {diff:.3e}")
    if not diff <= 1e-4:
        print("FAIL: logits differ by more than 1e-4")
        return 1

    mod = os.path.join(args.workdir, "mod")
    run([args.gmod, "convert", "--model", args.model, "--out", mod, "--rule", "layers:1"])
    cfg = json.load(open(os.path.join(mod, "config.json")))
    assert cfg["mod"]["mod_enable"] and cfg["mod"]["mod_layers_idx"] == [1], cfg.get("mod")
    m2, info = LlavaForConditionalGeneration.from_pretrained(mod, dtype=torch.float32, output_loading_info=True)
    missing = info.get("missing_keys", [])
    assert not missing, f"transformers misses tensors in the γ-MoD export: {missing}"
    unexpected = sorted(info.get("unexpected_keys", []))
    print(f"γ-MoD export: transformers loads it; extra (router) keys: {unexpected}")
    assert all(".router.weight" in k for k in unexpected), unexpected
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

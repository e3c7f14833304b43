#!/usr/bin/env python3
"""gmod's Hugging Face export loads in transformers and gives the same logits.

Exports the tiny LLaVA fixture with `gmod export --from-hf` (save_mod_pretrained, dense), loads the result
with transformers' LlavaForConditionalGeneration and compares its logits on random text ids with gmod's
(build/bench/bench_logits) within 1e-4. Also converts the fixture to γ-MoD with `gmod convert` and checks that
transformers still loads the dense part of that directory (the router tensors are extra keys to it). Then exports the tiny Qwen2.5-VL fixture and checks that transformers
loads it unedited with the fixture's logits (check_qwen2_5_vl).

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
    if check_qwen2_5_vl(args) != 0:
        return 1
    print("OK")
    return 0


def check_qwen2_5_vl(args):
    """`gmod export` of the tiny Qwen2.5-VL fixture (tests/fixtures/make_qwen2_5_vl_fixtures.py): transformers loads
    the directory unedited through AutoModelForImageTextToText and Qwen2_5_VLForConditionalGeneration, with no
    missing or extra tensor, and its logits on the fixture's batch (three images, padding, a text-only row) equal
    the references transformers computed on the original model within 1e-5 (test_hf_parity.cpp's bound; gmod's own
    logits are within it of the same references, tests/model/test_qwen2_5_vl.cpp)."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration

    src = os.path.join(ROOT, "tests/fixtures/qwen2_5_vl/full")
    out = os.path.join(args.workdir, "qwen2_5_vl")
    run([args.gmod, "export", "--from-hf", src, "--out", out])
    ref = load_file(os.path.join(src, "reference.safetensors"))
    ids, mask = ref["input.input_ids"], ref["input.attention_mask"]
    for cls in (AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration):
        model, info = cls.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
        model.eval()
        name = type(model).__name__
        if name != "Qwen2_5_VLForConditionalGeneration":
            print(f"FAIL: {cls.__name__} loads the Qwen2.5-VL export as {name}")
            return 1
        missing, unexpected = info.get("missing_keys", []), info.get("unexpected_keys", [])
        if missing or unexpected:
            print(f"FAIL: Qwen2.5-VL export: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
            return 1
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, pixel_values=ref["input.pixel_values"],
                           image_grid_thw=ref["input.image_grid_thw"],
                           mm_token_type_ids=(ids == model.config.image_token_id).int()).logits.float()
        diff = (logits - ref["logits"]).abs()[mask.bool()].max().item()
        print(f"Qwen2.5-VL export via {cls.__name__}: max |logits - reference| on real tokens = {diff:.3e}")
        if not diff <= 1e-5:
            print("FAIL: Qwen2.5-VL export logits differ by more than 1e-5")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

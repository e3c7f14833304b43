#!/usr/bin/env python3
"""Real-model integration check: gmod's logits for SmolLM2-135M-Instruct vs transformers.

Builds the model with make_smollm2.py if needed, tokenizes a prompt with transformers, runs
transformers and `gmod forward`-style C++ code (build/bench/bench_logits) on the same ids, and
compares logits. Prints the max abs difference; exits non-zero above the tolerance.

    $(launch/setup.sh | tail -1)/bin/python tests/realmodel/check_smollm2.py
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    out = subprocess.run([sys.executable, os.path.join(HERE, "make_smollm2.py")], check=True, capture_output=True,
                         text=True).stdout.strip().splitlines()[-1]
    tok = AutoTokenizer.from_pretrained(out)
    tok.padding_side = "right"  # gmod batches are right-padded
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.train(False)
    text = ["<|im_start|>user\nWhat colour is the sky on a clear day?<|im_end|>\n<|im_start|>assistant\n",
            "Mixture-of-Depths lets unimportant tokens skip a layer. 12345 + 678 = "]
    enc = tok(text, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = model(**enc).logits.float()
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.safetensors")
        res = os.path.join(tmp, "out.safetensors")
        save_file({"input_ids": enc["input_ids"].contiguous(), "attention_mask": enc["attention_mask"].contiguous()}, inp)
        binary = os.path.join(ROOT, "build", "bench", "bench_logits")
        subprocess.run([binary, out, inp, res], check=True)
        got = load_file(res)["logits"]
    valid = enc["attention_mask"].bool().unsqueeze(-1).expand_as(ref)
    diff = (got - ref).abs()[valid].max().item()
    scale = ref.abs()[valid].max().item()
    argmax_agree = (got.argmax(-1) == ref.argmax(-1))[enc["attention_mask"].bool()].float().mean().item()
    print(f"SmolLM2-135M: max abs logit diff {diff:.3e} (max |logit| {scale:.1f}), argmax agreement {argmax_agree:.4f}")
    return 0 if diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())

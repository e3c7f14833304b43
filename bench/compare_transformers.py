#!/usr/bin/env python3
"""gmod vs transformers: forward+backward step time on the same model, batch and thread count.

Runs build/bench/bench_model (C++) and the same step in Python (transformers, same torch build) and
prints both and the ratio. Inputs: random token ids from the same seed on both sides (not bitwise the
same ids, same shapes).

    python bench/compare_transformers.py --model tests/fixtures/hf/llama_untied_gqa --batch 4 --seq 128
    python bench/compare_transformers.py --model ~/.cache/gmod/smollm2-135m --batch 2 --seq 256

Needs transformers in the venv (`pip install transformers`).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch

try:
    from transformers import AutoModelForCausalLM
except ImportError:
    print("compare_transformers: transformers is not installed in this venv (launch/setup.sh installs it)")
    sys.exit(77)  # ctest's skip code


def python_step_ms(args):
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
    model.train(False)  # no dropout; same as gmod (no dropout at all)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.seq), generator=g)
    times = []
    for s in range(args.warmup + args.steps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        t1 = time.perf_counter()
        if s >= args.warmup:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--bench-binary", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench", "bench_model"))
    args = ap.parse_args()
    cmd = [args.bench_binary, "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads), "--dtype", args.dtype]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(out.strip())
    gmod_ms = float(re.search(r"median ([0-9.]+) ms", out).group(1))
    py_med, py_min = python_step_ms(args)
    print(f"transformers {torch.__version__}  median {py_med:.1f} ms/step  (min {py_min:.1f})")
    print(f"ratio transformers/gmod = {py_med / gmod_ms:.3f}  (>1: gmod faster)")


if __name__ == "__main__":
    sys.exit(main())

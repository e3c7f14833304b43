#!/usr/bin/env python3
"""Runs `gmod train` and checks its metrics.jsonl: the number of steps, every loss finite, the loss going down (the
last step's below the first's, and the mean of the second half below that of the first half).

The data file is copied into the work dir first, so that the record index (<file>.gmodidx) is written there and not
next to a committed fixture.

Usage: check_train_loss.py --gmod BIN --workdir DIR --data TRAIN.json --steps N -- TRAIN_ARGS...
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    extra = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    data = os.path.join(args.workdir, "train.json")
    shutil.copyfile(args.data, data)
    run_dir = os.path.join(args.workdir, "run")
    cmd = [args.gmod, "train", *extra, "--set", f"data.train={data}", "--set", f"run_dir={run_dir}",
           "--set", "resume=none", "--set", f"schedule.max_steps={args.steps}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(out.stdout + out.stderr, flush=True)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)}: exit code {out.returncode}")
    steps = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "loss" in m and "step" in m and m.get("kind", "train") == "train":
                steps.append((m["step"], m["loss"]))
    losses = [l for _, l in steps]
    print("losses:", " ".join(f"{l:.4f}" for l in losses), flush=True)
    if len(steps) != args.steps:
        fail(f"{len(steps)} training steps in metrics.jsonl, expected {args.steps}")
    if not all(isinstance(l, (int, float)) and math.isfinite(l) for l in losses):
        fail("a loss is not finite")
    half = len(losses) // 2
    first, second = sum(losses[:half]) / half, sum(losses[-half:]) / half
    if not (losses[-1] < losses[0] and second < first):
        fail(f"the loss does not go down: first {losses[0]:.4f}, last {losses[-1]:.4f}, "
             f"means {first:.4f} -> {second:.4f}")
    print(f"ok: {len(losses)} finite losses, {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()

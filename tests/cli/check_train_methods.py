#!/usr/bin/env python3
"""Runs `gmod train` once per MoD method on one config (the tiny Qwen2.5-VL's: native-resolution images, 3-D M-RoPE
positions) and checks each run's metrics.jsonl: the number of steps, every loss finite, and that the run's MoD
layers skipped tokens (a skip ratio above 0 in some layer at every step). Prints one line per method.

The data file is copied into the work dir first, so that the record index (<file>.gmodidx) is written there and not
next to a committed fixture.

Usage: check_train_methods.py --gmod BIN --workdir DIR --data TRAIN.json --steps N
           --method NAME [--set K=V ...] [--method NAME ...] -- TRAIN_ARGS...
A method is its name followed by the --set overrides that select it (none: the config's own method).
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


def split_methods(argv):
    """['--method', 'a', '--set', 'x=1', '--method', 'b'] -> [('a', ['--set', 'x=1']), ('b', [])]"""
    methods = []
    for i, a in enumerate(argv):
        if a == "--method":
            methods.append((argv[i + 1], []))
        elif a == "--set" and methods:
            methods[-1][1].extend(["--set", argv[i + 1]])
    return methods


def main():
    argv = sys.argv[1:]
    sep = argv.index("--") if "--" in argv else len(argv)
    train_args = argv[sep + 1:]
    own = [a for i, a in enumerate(argv[:sep])
           if a not in ("--method", "--set") and (i == 0 or argv[i - 1] not in ("--method", "--set"))]
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, required=True)
    args = ap.parse_args(own)
    methods = split_methods(argv[:sep])
    if not methods:
        fail("no --method given")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    data = os.path.join(args.workdir, "train.json")
    shutil.copyfile(args.data, data)
    results = []
    for k, (name, sets) in enumerate(methods):
        run_dir = os.path.join(args.workdir, f"run{k}")
        cmd = [args.gmod, "train", *train_args, "--set", f"data.train={data}", "--set", f"run_dir={run_dir}",
               "--set", "resume=none", "--set", f"schedule.max_steps={args.steps}", *sets]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        print(out.stdout + out.stderr, flush=True)
        if out.returncode != 0:
            fail(f"{name}: {' '.join(cmd)}: exit code {out.returncode}")
        steps = []
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                m = json.loads(line)
                if "loss" in m and "step" in m and m.get("kind", "train") == "train":
                    steps.append(m)
        if len(steps) != args.steps:
            fail(f"{name}: {len(steps)} training steps in metrics.jsonl, expected {args.steps}")
        losses = [m["loss"] for m in steps]
        if not all(isinstance(l, (int, float)) and math.isfinite(l) for l in losses):
            fail(f"{name}: a loss is not finite: {losses}")
        for m in steps:
            sr = m.get("skip_ratio") or {}
            if not sr or max(sr.values()) <= 0:
                fail(f"{name}: step {m['step']} has no MoD layer skipping tokens (skip_ratio {sr})")
        last = steps[-1]["skip_ratio"]
        results.append((name, losses, last))
    for name, losses, sr in results:
        layers = " ".join(f"layer {l} {r:.3f}" for l, r in sorted(sr.items(), key=lambda x: int(x[0])))
        print(f"ok: {name}: {len(losses)} finite losses {losses[0]:.4f} -> {losses[-1]:.4f}; skip ratio {layers}",
              flush=True)


if __name__ == "__main__":
    main()

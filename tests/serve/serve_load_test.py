#!/usr/bin/env python3
"""A bounded load test of `gmod serve` on loopback, dense and γ-MoD: REQUESTS requests (6 prompts of different
lengths, CONCURRENCY at a time) against each server; every answer must equal `gmod generate`'s for the same
prompt (the independent oracle, one process per prompt), and the whole run must end within its deadline.
Prints p50/p99 latency and completion tokens/s of each. The load generator is bench/bench_serve.py's.

Usage: serve_load_test.py --gmod BIN --bench-dir DIR [--mod RULE] -- MODEL_ARGS...
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import check, fail, generate  # noqa: E402

REQUESTS = 48
CONCURRENCY = 12
MAX_TOKENS = 16
DEADLINE_S = 240


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--mod", default="layers:2,3")
    ap.add_argument("model_args", nargs="+")
    args = ap.parse_args()
    sys.path.insert(0, args.bench_dir)
    import bench_serve as bs

    t_start = time.time()
    prompts = [bs.PROMPTS[i % len(bs.PROMPTS)] for i in range(REQUESTS)]
    for name, extra in [("dense", []), ("γ-MoD", ["--mod", args.mod])]:
        margs = argparse.Namespace(gmod=args.gmod, model_args=args.model_args + extra)
        want = {p: generate(margs, p, max_new=MAX_TOKENS) for p in bs.PROMPTS}
        server = bs.ServeProcess(args.gmod, margs.model_args + ["--max-batch", "8", "--max-queue", "64",
                                                                "--max-new-tokens", str(MAX_TOKENS)])
        try:
            results, wall = bs.run_load(server.base, prompts, CONCURRENCY, MAX_TOKENS, deadline_s=DEADLINE_S)
        except Exception as e:  # a refused or timed-out request fails the test with its cause
            fail(f"{name}: a request failed under load: {e!r}")
        finally:
            server.close()
        wrong = [(p, r[0], want[p]) for p, r in zip(prompts, results) if r[0] != want[p]]
        check(not wrong, f"{name}: all {REQUESTS} answers under load equal gmod generate's ({wrong[:2]})")
        s = bs.summary(results, wall)
        print(f"{name}: {REQUESTS} requests, concurrency {CONCURRENCY}: p50 {s['p50_s']:.3f} s, "
              f"p99 {s['p99_s']:.3f} s, {s['tokens_per_s']:.1f} tokens/s ({s['tokens']} tokens in {wall:.2f} s)",
              flush=True)
    check(time.time() - t_start < 2 * DEADLINE_S, f"within the time bound ({time.time() - t_start:.0f} s)")
    print("PASS", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks the stats files of `gmod answer` (--stats, docs/eval.md) for one question set answered several ways:
one process at batch 1 (B1) and at batch 4 (B4), two chunks (C0, C1) and two MPI ranks (MPI), both at batch 2.
The counts of work depend neither on the batch nor on splitting (a sample that ended is not run through further
steps; the K/V held after each prefill counts no padding), so the batch-4, chunked (summed) and MPI (summed by gmod)
stats must equal the batch-1 ones; FLOPs within 1e-9 relative. The sample count equals the answer file's lines; the prefill and decode times are measured.
Python standard library only. Usage: check_answer_stats.py PREFIX (files PREFIX_b1.stats.json, ...)"""
import json
import math
import sys

p = sys.argv[1]
load = lambda k: json.load(open("%s_%s.stats.json" % (p, k)))
b1, b4, c0, c1, mpi = load("b1"), load("b4"), load("c0"), load("c1"), load("mpi")
INT = ["samples", "asked", "prompt_tokens", "generated_tokens", "layer_tokens", "processed_layer_tokens",
       "mod_layer_tokens", "processed_mod_layer_tokens", "kv_cache_bytes"]
errors = []
lines = len(open(p + "_b1.jsonl").read().splitlines())
if b1["samples"] != lines or b1["samples"] <= 0:
    errors.append("b1: %d samples for %d answer lines" % (b1["samples"], lines))
for name, got in (("b4", b4), ("c0+c1", {k: c0[k] + c1[k] for k in INT + ["flops", "dense_flops"]}), ("mpi", mpi)):
    for k in INT:
        if got[k] != b1[k]:
            errors.append("%s: %s %r, batch 1 %r" % (name, k, got[k], b1[k]))
    for k in ("flops", "dense_flops"):
        if not math.isclose(got[k], b1[k], rel_tol=1e-9):
            errors.append("%s: %s %r, batch 1 %r" % (name, k, got[k], b1[k]))
if mpi["ranks"] != 2:
    errors.append("mpi: ranks %r" % mpi["ranks"])
if not math.isclose(b1["tflops_per_sample"], b1["flops"] / b1["samples"] / 1e12, rel_tol=1e-12):
    errors.append("tflops_per_sample is not flops / samples / 1e12")
skip = 1 - b1["processed_layer_tokens"] / b1["layer_tokens"]
if not math.isclose(b1["skip_ratio"], skip, abs_tol=1e-12):
    errors.append("skip_ratio %r, counts give %r" % (b1["skip_ratio"], skip))
for name, st in (("b1", b1), ("b4", b4), ("mpi", mpi)):
    for k in ("prefill_seconds", "decode_seconds", "decode_steps"):
        if not isinstance(st.get(k), (int, float)) or st[k] < 0:
            errors.append("%s: %s %r, not a measurement" % (name, k, st.get(k)))
if b4["decode_steps"] >= b1["decode_steps"]:
    errors.append("b4: %r decode steps, not fewer than batch 1's %r" % (b4["decode_steps"], b1["decode_steps"]))
for e in errors:
    print("FAIL:", e)
print("stats checked: %d samples, %d problem(s)" % (b1["samples"], len(errors)))
sys.exit(1 if errors else 0)

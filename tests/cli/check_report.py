#!/usr/bin/env python3
"""Checks a `gmod report` output folder against the files it was built from (docs/eval.md), computing every
figure again here: each benchmark's headline figure from OUT/<model>/<benchmark>/score.json (`gmod score --json`)
on the γ-MoD paper's scale, the average (MME perception / 20), skip ratio and TFLOPs per sample from the
answers' stats files, the changes against the first model; that report.md has a row per model and a column per
benchmark holding those figures; that the stats count the answer file's records; and, for the demo suite,
that the dense model skips nothing while the γ-MoD one skips tokens and costs fewer FLOPs.
Python standard library only. Usage: check_report.py OUT SUITE.json"""
import json
import math
import os
import re
import sys

out, suite_path = sys.argv[1], sys.argv[2]
suite = json.load(open(suite_path))
report = json.load(open(os.path.join(out, "report.json")))
md = open(os.path.join(out, "report.md")).read()
svg = open(os.path.join(out, "report.svg")).read()
errors = []


def fail(msg):
    errors.append(msg)


def close(a, b, what):
    if a is None or b is None:
        if a is not b:
            fail("%s: %r vs %r" % (what, a, b))
    elif not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
        fail("%s: report %r, expected %r" % (what, a, b))


def slug(name):
    return "".join(c.lower() if c.isalnum() else "_" for c in name)


# figure name and scale per scorer, as the paper shows them (percent; SQA-IMG already in percent; MME out of 2000)
HEAD = {"gqa": ("accuracy", 100), "textvqa": ("accuracy", 100), "vqav2": ("accuracy", 100),
        "mmbench": ("accuracy", 100), "mmmu": ("accuracy", 100), "scienceqa": ("img_acc", 1),
        "pope": ("mean_f1", 100), "mme": ("perception", 1)}

names = [b["name"] for b in suite["benchmarks"]]
if [b["name"] for b in report["benchmarks"]] != names:
    fail("report benchmarks %s, suite %s" % ([b["name"] for b in report["benchmarks"]], names))
if [m["name"] for m in report["models"]] != [m["name"] for m in suite["models"]]:
    fail("report models differ from the suite's")

lines = md.splitlines()
header = [c.strip() for c in lines[0].strip("|").split("|")]
want_cols = ["Model"] + names + ["Avg", "Skip", "TFLOPs", "Prefill (ms)", "Decode (ms/token)", "Δ Avg", "Δ TFLOPs"]
if header != want_cols:
    fail("report.md columns %s, expected %s" % (header, want_cols))
rows = {}
for l in lines[2:]:
    if not l.startswith("|"):
        break
    cells = [c.strip() for c in l.strip("|").split("|")]
    rows[cells[0]] = dict(zip(header, cells))

ref = None
for model in suite["models"]:
    row = next((m for m in report["models"] if m["name"] == model["name"]), None)
    mdrow = rows.get(model["name"])
    if row is None or mdrow is None:
        fail("no row for model %s (json: %s, md: %s)" % (model["name"], row is not None, mdrow is not None))
        continue
    total = {"samples": 0, "flops": 0.0, "proc": 0, "all": 0}
    avg = []
    for b in suite["benchmarks"]:
        d = os.path.join(out, slug(model["name"]), slug(b["name"]))
        score = json.load(open(os.path.join(d, "score.json")))
        stats = json.load(open(os.path.join(d, "answers.stats.json")))
        answers = os.path.join(d, "output.json" if b.get("format") == "mmmu" else "answers.jsonl")
        text = open(answers).read()
        n_records = len(json.loads(text)) if text.lstrip().startswith("[") else len(text.splitlines())
        if n_records != stats["asked"]:
            fail("%s/%s: %d answer records, stats say %d asked" % (model["name"], b["name"], n_records, stats["asked"]))
        fig, scale = HEAD[b["scorer"]]
        v = score["figures"].get(fig)
        v = None if v is None else v * scale
        close(row["scores"][b["name"]], v, "%s/%s headline" % (model["name"], b["name"]))
        shown = mdrow.get(b["name"])
        if shown != ("n/a" if v is None else "%.2f" % v):
            fail("%s/%s: report.md shows %r, score.json gives %r" % (model["name"], b["name"], shown, v))
        if v is not None:
            avg.append(v / 20 if b["scorer"] == "mme" else v)
        total["samples"] += stats["samples"]
        total["flops"] += stats["flops"]
        total["proc"] += stats["processed_layer_tokens"]
        total["all"] += stats["layer_tokens"]
        if stats["samples"] <= 0 or stats["generated_tokens"] <= 0 or stats["prompt_tokens"] <= 0:
            fail("%s/%s: stats count no work: %s" % (model["name"], b["name"], stats))
        for k in ("prefill_seconds", "decode_seconds"):
            if k not in stats:
                fail("%s/%s: stats without %s" % (model["name"], b["name"], k))
    a = sum(avg) / len(avg) if avg else None
    close(row["average"], a, "%s average" % model["name"])
    if mdrow.get("Avg") != ("n/a" if a is None else "%.2f" % a):
        fail("%s: report.md Avg %r, expected %.2f" % (model["name"], mdrow.get("Avg"), a))
    skip = 1 - total["proc"] / total["all"]
    tflops = total["flops"] / total["samples"] / 1e12
    close(row["skip_ratio"], skip, "%s skip ratio" % model["name"])
    close(row["tflops_per_sample"], tflops, "%s TFLOPs per sample" % model["name"])
    if mdrow.get("Skip") != "%.1f%%" % (100 * skip):
        fail("%s: report.md Skip %r, expected %.1f%%" % (model["name"], mdrow.get("Skip"), 100 * skip))
    if ref is None:
        ref = (a, tflops)
    close(row["delta_average"], a - ref[0], "%s Δ average" % model["name"])
    close(row["delta_tflops_percent"], (tflops / ref[1] - 1) * 100, "%s Δ TFLOPs" % model["name"])
    if not re.search(">%s</text>" % re.escape(model["name"]), svg):
        fail("report.svg has no point labelled %s" % model["name"])
    model["_skip"], model["_tflops"] = skip, tflops

# the demo suite: a dense model, then its γ-MoD conversion
ms = suite["models"]
if len(ms) >= 2 and "_skip" in ms[0] and "_skip" in ms[1]:
    if ms[0]["_skip"] != 0:
        fail("the dense model skips %.4f of its token-layers" % ms[0]["_skip"])
    if not (ms[1]["_skip"] > 0 and ms[1]["_tflops"] < ms[0]["_tflops"]):
        fail("the γ-MoD model does not skip (skip %.4f, TFLOPs %.4g vs dense %.4g)"
             % (ms[1]["_skip"], ms[1]["_tflops"], ms[0]["_tflops"]))

for e in errors:
    print("FAIL:", e)
print("report checked: %d models x %d benchmarks, %d problem(s)" % (len(suite["models"]), len(names), len(errors)))
sys.exit(1 if errors else 0)

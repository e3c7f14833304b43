#!/usr/bin/env python3
"""Checks the method table of a `gmod report` suite (docs/mod.md, "Every method on one run") against the files it
was built from, computing every figure again here: the training figures from each trained model's
run/metrics.jsonl (median step time after the suite's warm-up steps, samples/s, FLOPs per trained sample), the
timing figures from each timing run's stats (prefill per call of B prompts, next-token time per decode step, K/V
bytes and TFLOPs per sample), every ratio against the first row, and that report.md's "## Methods" table shows them.
Independent oracles besides: every timing run generated exactly max_new_tokens per question (--ignore-eos), so
every model did the same decode steps; the K/V bytes of a dense model are prompt tokens x layers x 2 x kv_heads x
head_dim x 4 (fp32), and those of FastV K:R and PyramidDrop L:R on it follow from the rule and the image count
(each image sample drops its image tokens per layer as the rule says).
Python standard library only. Usage: check_methods.py OUT SUITE.json"""
import json
import math
import os
import statistics
import sys

out, suite_path = sys.argv[1], sys.argv[2]
suite = json.load(open(suite_path))
report = json.load(open(os.path.join(out, "report.json")))
md = open(os.path.join(out, "report.md")).read()
errors = []


def fail(msg):
    errors.append(msg)


def close(a, b, what, rel=1e-9):
    if a is None or b is None:
        if a is not b:
            fail("%s: %r vs %r" % (what, a, b))
    elif not math.isclose(a, b, rel_tol=rel, abs_tol=1e-15):
        fail("%s: report %r, expected %r" % (what, a, b))


def slug(name):
    return "".join(c.lower() if c.isalnum() else "_" for c in name)


def training(path, warmup):
    steps = [json.loads(l) for l in open(path) if l.strip()]
    steps = [s for s in steps if isinstance(s.get("step_s"), (int, float))]
    skip = warmup if len(steps) > warmup else 0
    timed = steps[skip:]
    secs = sum(s["step_s"] for s in timed)
    return {"steps": len(timed),
            "step_ms_median": statistics.median(s["step_s"] * 1e3 for s in timed),
            "samples_per_s": sum(s["samples"] for s in timed) / secs,
            "train_tflops_per_sample": sum(s["flops"] for s in steps) / sum(s["samples"] for s in steps) / 1e12}


def rule_of(model):
    """("fastv", K, R) / ("pdrop", layers, ratios) from a model's answer args or training --set, else None."""
    args = model.get("args", []) + model.get("train", [])
    for i, a in enumerate(args):
        if a in ("--fastv", "--pdrop") and i + 1 < len(args):
            return parse_rule(a[2:], args[i + 1])
        if a.startswith("mod.rule=pdrop:"):
            return parse_rule("pdrop", a[len("mod.rule=pdrop:"):])
    return None


def parse_rule(kind, spec):
    left, right = spec.split(":")
    if kind == "fastv":
        return ("fastv", int(left), float(right))
    return ("pdrop", [int(x) for x in left.split(",")], [float(x) for x in right.split(",")])


def model_dir(m):
    if "train" in m:
        return os.path.join(out, slug(m["name"]), "hf")
    if "convert" in m:
        return os.path.join(out, slug(m["name"]), "model")
    if "from" in m:
        return model_dir(next(e for e in suite["models"] if e["name"] == m["from"]))
    return m["model"]


methods = report.get("methods")
if not methods:
    sys.exit("check_methods: %s/report.json has no \"methods\"" % out)
timing = suite["timing"]
batches = timing.get("batches", [1, 8])
max_new = timing.get("max_new_tokens", 16)
warmup = suite["train"].get("warmup_steps", 2)
if methods["batches"] != batches:
    fail("batches %r, suite %r" % (methods["batches"], batches))
rows = methods["rows"]
if [r["name"] for r in rows] != [m["name"] for m in suite["models"]]:
    fail("method rows %r differ from the suite's models" % [r["name"] for r in rows])
avg = {m["name"]: m["average"] for m in report["models"]}

# Questions with an image in the timing set (every one has 16 image tokens in the demo model).
qs = [json.loads(l) for l in open(timing["questions"]) if l.strip()]
n_image_q = sum(1 for q in qs if q.get("image"))

expected = {}
models = {m["name"]: m for m in suite["models"]}
for m in suite["models"]:
    name, d = m["name"], os.path.join(out, slug(m["name"]))
    f = {}
    if "train" in m:
        t = training(os.path.join(d, "run", "metrics.jsonl"), warmup)
        f["step_ms"], f["samples_per_s"] = t["step_ms_median"], t["samples_per_s"]
        f["train_tflops_per_sample"] = t["train_tflops_per_sample"]
        if t["steps"] < 1:
            fail("%s: no timed training step" % name)
    else:
        f["step_ms"] = f["samples_per_s"] = f["train_tflops_per_sample"] = None
    for i, b in enumerate(batches):
        st = json.load(open(os.path.join(d, "timing_b%d" % b, "answers.stats.json")))
        n = st["samples"]
        if not st.get("ignore_eos"):
            fail("%s b%d: timing run without --ignore-eos" % (name, b))
        if st["generated_tokens"] != n * max_new:
            fail("%s b%d: %d tokens generated, expected %d x %d" % (name, b, st["generated_tokens"], n, max_new))
        calls = math.ceil(n / b)
        if st["decode_steps"] != calls * (max_new - 1):
            fail("%s b%d: %d decode steps, expected %d" % (name, b, st["decode_steps"], calls * (max_new - 1)))
        f["prefill_ms_b%d" % b] = st["prefill_seconds"] / calls * 1e3
        f["next_token_ms_b%d" % b] = st["decode_seconds"] / st["decode_steps"] * 1e3
        if i == 0:
            f["kv_bytes_per_sample"] = st["kv_cache_bytes"] / n
            f["tflops_per_sample"] = st["flops"] / n / 1e12
            kv_entries = st["kv_cache_bytes"]
            prompt_tokens = st["prompt_tokens"]
        elif st["kv_cache_bytes"] != kv_entries:
            fail("%s: K/V bytes differ between batch sizes (%d vs %d)" % (name, st["kv_cache_bytes"], kv_entries))
    # The K/V oracle for dense-based rows: the model dir's config.
    cfg = json.load(open(os.path.join(model_dir(m), "config.json")))
    tc = cfg.get("text_config", cfg)
    layers, hkv = tc["num_hidden_layers"], tc.get("num_key_value_heads", tc["num_attention_heads"])
    dh = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    per_entry = 2 * hkv * dh * 4
    n_img = cfg.get("image_seq_length", 16)
    rule = rule_of(m)
    dense_kv = prompt_tokens * layers * per_entry
    if name == suite["models"][0]["name"]:
        close(kv_entries, dense_kv, "%s: K/V bytes vs prompt tokens x layers" % name)
    elif rule and rule[0] == "fastv":
        k, r = rule[1], rule[2]
        dropped = n_img - round(n_img * (1 - r))
        close(kv_entries, dense_kv - n_image_q * (layers - k) * dropped * per_entry, "%s: FastV K/V bytes" % name)
    elif rule and rule[0] == "pdrop":
        stages, ratios = rule[1], rule[2]
        drop = 0
        for s, (first, ratio) in enumerate(zip(stages, ratios)):
            last = stages[s + 1] if s + 1 < len(stages) else layers
            drop += (last - first) * (n_img - math.trunc(n_img * ratio))
        close(kv_entries, dense_kv - n_image_q * drop * per_entry, "%s: PyramidDrop K/V bytes" % name)
    expected[name] = f

ref = expected[suite["models"][0]["name"]]
lines = md.split("## Methods", 1)[1].strip().splitlines() if "## Methods" in md else []
if not lines:
    fail("report.md has no \"## Methods\" table")
header = [c.strip() for c in lines[0].strip("|").split("|")] if lines else []
mdrows = {}
for l in lines[2:]:
    if not l.startswith("|"):
        break
    cells = [c.strip() for c in l.strip("|").split("|")]
    mdrows[cells[0]] = dict(zip(header, cells))
for r in rows:
    name = r["name"]
    f = expected.get(name)
    if f is None:
        continue
    close(r["average"], avg.get(name), "%s: average" % name)
    for key, v in f.items():
        close(r["figures"].get(key), v, "%s: %s" % (name, key))
        base = ref.get(key)
        close(r["ratios"].get(key), v / base if v is not None and base else None, "%s: ratio of %s" % (name, key))
    mr = mdrows.get(name)
    if mr is None:
        fail("report.md's method table has no row %s" % name)
        continue
    for b in batches:
        col = "Next token b%d (ms)" % b
        v = f["next_token_ms_b%d" % b]
        want = "%.2f (%.2f×)" % (v, v / ref["next_token_ms_b%d" % b])
        if mr.get(col) != want:
            fail("%s: report.md %s %r, expected %r" % (name, col, mr.get(col), want))
    kib = f["kv_bytes_per_sample"] / 1024
    want = "%.1f (%.2f×)" % (kib, f["kv_bytes_per_sample"] / ref["kv_bytes_per_sample"])
    if mr.get("KV after prefill (KiB/sample)") != want:
        fail("%s: report.md KV %r, expected %r" % (name, mr.get("KV after prefill (KiB/sample)"), want))
    if "train" not in models[name] and mr.get("Train step (ms)") != "n/a":
        fail("%s: not trained by the suite, yet a training time %r" % (name, mr.get("Train step (ms)")))

# Every method that drops tokens holds fewer K/V entries and runs fewer FLOPs than dense on the same prompts.
for name, f in expected.items():
    if name == suite["models"][0]["name"] or name == "gamma-MoD":  # γ-MoD's threshold may skip nothing this early
        continue
    if not f["kv_bytes_per_sample"] < ref["kv_bytes_per_sample"]:
        fail("%s: K/V bytes %r not below dense %r" % (name, f["kv_bytes_per_sample"], ref["kv_bytes_per_sample"]))
    if not f["tflops_per_sample"] < ref["tflops_per_sample"]:
        fail("%s: TFLOPs %r not below dense %r" % (name, f["tflops_per_sample"], ref["tflops_per_sample"]))

if errors:
    print("\n".join(errors))
    sys.exit(1)
print("method table OK: %d models, batches %s, %d figures each recomputed from the runs' files" %
      (len(rows), batches, len(ref)))

#!/usr/bin/env python3
"""`gmod convert --adaptive-threshold seqlen` measures avg_seqlen when it is not given, and records where it came from.

avg_seqlen is the mean `seqlen` of the adaptive rule (mod/routing_rule.h: a sample's real tokens at prefill) over the
calibration samples: the first N image records of the data, each asked as its first question. The oracle here is
independent of the measurement (data/arank_samples.h: batched, padded, cut at the first supervised token): it picks
the records from the JSON itself and asks `gmod generate` each first question with its image, one at a time, and
averages the prompt token counts generate reports ("prompt: N tokens"), i.e. the seqlen the model's prefill has
when it answers that question. Checked for both sources, the ARank file `gmod arank --out` writes and
`--avg-seqlen-data`; then the named errors: a data file with records that cannot be read, a file that is not JSON,
no source at all, an ARank file without "seqlen", --avg-seqlen with --avg-seqlen-data.

Usage: check_avg_seqlen.py --gmod BIN --dense DIR --data TRAIN.json --workdir DIR [--samples N]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok:", msg, flush=True)


def gmod(args, *cmd, rc=0):
    out = subprocess.run([args.gmod, *cmd], capture_output=True, text=True, timeout=600)
    if out.returncode != rc:
        fail(f"gmod {' '.join(cmd)}: exit code {out.returncode}, expected {rc}\n{out.stdout}\n{out.stderr}")
    return out.stdout + out.stderr


def mod_of(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["mod"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--dense", required=True, help="a dense model dir with weights and its tokenizer")
    ap.add_argument("--data", required=True, help="LLaVA-format records with images (the demo's train.json)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    w = args.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    n = str(args.samples)

    # The oracle: the first N image records' first questions through gmod generate, one at a time.
    with open(args.data) as f:
        records = json.load(f)
    folder = os.path.dirname(os.path.abspath(args.data))
    lengths = []
    for r in records:
        if len(lengths) == args.samples:
            break
        if "image" not in r:
            continue
        question = r["conversations"][0]["value"].replace("<image>", "").strip()
        out = gmod(args, "generate", "--model", args.dense, "--threads", "1", "--image",
                   os.path.join(folder, r["image"]), "--prompt", question, "--max-new-tokens", "1")
        lengths.append(int(re.search(r"prompt: (\d+) tokens, 1 images", out).group(1)))
    check(len(lengths) == args.samples, f"{args.samples} image records in {args.data}")
    check(len(set(lengths)) > 1, f"prompt lengths differ, so padding would show: {lengths}")
    want = sum(lengths) / len(lengths)
    print("oracle avg_seqlen:", want, flush=True)

    common = ["convert", "--model", args.dense, "--rule", "layers:2,3", "--adaptive-threshold", "seqlen"]
    # From gmod arank's file (its samples: the same first N image records, first prompts).
    gmod(args, "arank", "--model", args.dense, "--threads", "1", "--data", args.data, "--samples", n, "--batch", "3",
         "--out", os.path.join(w, "arank.json"))
    out = gmod(args, *common, "--out", os.path.join(w, "by_arank"), "--arank", os.path.join(w, "arank.json"))
    mod = mod_of(os.path.join(w, "by_arank"))
    check(abs(mod["avg_seqlen"] - want) < 1e-9, f"avg_seqlen from the ARank file {mod['avg_seqlen']} = {want}")
    check(f"{n} first prompts of {args.data}" in mod["avg_seqlen_source"] and "gmod arank" in mod["avg_seqlen_source"],
          f"its source is recorded: {mod['avg_seqlen_source']!r}")
    check("avg_seqlen " in out, "and printed")
    # Measured by convert itself on --avg-seqlen-data.
    gmod(args, *common, "--out", os.path.join(w, "by_data"), "--avg-seqlen-data", args.data,
         "--avg-seqlen-samples", n)
    mod = mod_of(os.path.join(w, "by_data"))
    check(abs(mod["avg_seqlen"] - want) < 1e-9, f"avg_seqlen from --avg-seqlen-data {mod['avg_seqlen']} = {want}")
    check("measured by gmod convert" in mod["avg_seqlen_source"], f"source {mod['avg_seqlen_source']!r}")
    # Given.
    gmod(args, *common, "--out", os.path.join(w, "given"), "--avg-seqlen", "61.5")
    mod = mod_of(os.path.join(w, "given"))
    check(mod["avg_seqlen"] == 61.5 and mod["avg_seqlen_source"] == "given (--avg-seqlen)", f"given: {mod}")

    # Records that cannot be read are named (file, record, what), not averaged around.
    bad = [records[0], {"id": "no-turns", "image": records[0]["image"], "conversations": "nope"}, records[1]]
    bad_path = os.path.join(folder, "avg_seqlen_bad.json")
    with open(bad_path, "w") as f:
        json.dump(bad, f)
    out = gmod(args, *common, "--out", os.path.join(w, "x"), "--avg-seqlen-data", bad_path, rc=1)
    check("avg_seqlen_bad.json" in out and "1 record(s) cannot be read" in out and "no-turns" in out,
          f"a bad record is named: {out.strip().splitlines()[-1]}")
    missing = [dict(records[0], id="gone", image="images/no_such.png")]
    with open(bad_path, "w") as f:
        json.dump(missing, f)
    out = gmod(args, *common, "--out", os.path.join(w, "x"), "--avg-seqlen-data", bad_path, rc=1)
    check("avg_seqlen_bad.json" in out and "gone" in out and "no_such.png" in out,
          f"a missing image is named: {out.strip().splitlines()[-1]}")
    with open(bad_path, "w") as f:
        f.write("[{\"id\": ")
    out = gmod(args, *common, "--out", os.path.join(w, "x"), "--avg-seqlen-data", bad_path, rc=1)
    check("avg_seqlen_bad.json" in out, f"a file that is not JSON is named: {out.strip().splitlines()[-1]}")
    os.remove(bad_path)
    # No source, an old ARank file, both sources given.
    out = gmod(args, *common, "--out", os.path.join(w, "x"), rc=2)
    check("needs avg_seqlen" in out and "--avg-seqlen-data" in out, "no source: a usage error saying the ways")
    old = os.path.join(w, "old_arank.json")
    with open(os.path.join(w, "arank.json")) as f:
        j = json.load(f)
    del j["seqlen"]
    with open(old, "w") as f:
        json.dump(j, f)
    out = gmod(args, *common, "--out", os.path.join(w, "x"), "--arank", old, rc=1)
    check("old_arank.json" in out and "no \"seqlen\"" in out, "an ARank file without seqlen is named")
    out = gmod(args, *common, "--out", os.path.join(w, "x"), "--avg-seqlen", "5", "--avg-seqlen-data", args.data, rc=2)
    check("excludes --avg-seqlen-data" in out, "--avg-seqlen with --avg-seqlen-data is a usage error")
    out = gmod(args, "convert", "--model", args.dense, "--rule", "layers:2", "--out", os.path.join(w, "x"),
               "--avg-seqlen-data", args.data, rc=2)
    check("for --adaptive-threshold seqlen" in out, "--avg-seqlen-data without seqlen thresholds is a usage error")
    print("all checks passed")


if __name__ == "__main__":
    main()

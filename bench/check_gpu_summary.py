#!/usr/bin/env python3
"""Asserts on the summary.json that bench/gpu_check.sh writes (ctest gpu_check_dry_run and gpu_check_planted).

usage: check_gpu_summary.py SUMMARY [--parts "mod llava ..."] [--pass "train zero3 ..."] [--fail PART --reason TEXT]
                            [--planted NAME]
  --parts    the parts, in order, the summary must name
  --pass     parts whose status must be PASS (not SKIP): their figures are then checked too (train: the profiler
             trace's bytes and events; mfu: gmod plan's figures beside the measured peaks, one row per variant and
             checkpointing)
  --fail     the one part that must be FAIL, its text containing --reason; no other part may FAIL
  --planted  the planted bug the summary must record (none: it must record none)
Exit 0 when every assertion holds, else 1 with one line per one that did not.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary")
    ap.add_argument("--parts", default="")
    ap.add_argument("--pass", dest="passing", default="")
    ap.add_argument("--fail", default="")
    ap.add_argument("--reason", default="")
    ap.add_argument("--planted", default="")
    a = ap.parse_args()
    try:
        with open(a.summary, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{a.summary}: cannot read it as JSON: {e}")
        return 1
    bad = []
    parts = {p["name"]: p for p in d.get("parts", [])}
    names = [p["name"] for p in d.get("parts", [])]
    print(f"{a.summary}: state {d.get('state')!r}, planted {d.get('planted')!r}")
    for p in d.get("parts", []):
        print(f"  {p['name']:8s} {p['status']:4s} {p['text'][:150]}")
    if d.get("state") in (None, "running"):
        bad.append(f"state is {d.get('state')!r}: the run did not finish")
    if a.parts and names != a.parts.split():
        bad.append(f"parts {names}, expected {a.parts.split()}")
    if (d.get("planted") or "") != a.planted:
        bad.append(f"planted {d.get('planted')!r}, expected {a.planted or None!r}")
    for name, p in parts.items():
        if p["status"] == "FAIL" and name != a.fail:
            bad.append(f"part {name} FAILed: {p['text']}")
    if a.fail:
        p = parts.get(a.fail)
        if p is None:
            bad.append(f"part {a.fail} is not in the summary")
        elif p["status"] != "FAIL":
            bad.append(f"part {a.fail} is {p['status']}, not FAIL: the planted bug went unseen ({p['text']})")
        elif a.reason not in p["text"]:
            bad.append(f"part {a.fail} FAILed, but not for the planted reason ({a.reason!r} not in {p['text']!r})")
    for name in a.passing.split():
        p = parts.get(name)
        if p is None or p["status"] != "PASS":
            bad.append(f"part {name} is {p['status'] if p else 'missing'}, not PASS")
            continue
        if name == "train" and not (p.get("trace_bytes", 0) > 0 and p.get("trace_events", 0) > 0):
            bad.append(f"part train PASSed without a profiler trace's figures: {p}")
        if name == "mfu":
            rows = p.get("memory_vs_plan")
            if not isinstance(rows, list) or len(rows) != 4 or any(r.get("plan_peak_mib", 0) <= 0 for r in rows):
                bad.append(f"part mfu PASSed without gmod plan's figures for 2 variants x 2 checkpointings: {rows}")
            elif d.get("cuda") and any(r.get("measured_allocated_mib") is None for r in rows):
                bad.append(f"part mfu on CUDA without a measured peak beside each plan: {rows}")
    for b in bad:
        print("check_gpu_summary: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

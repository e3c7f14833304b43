#!/usr/bin/env python3
"""gmod train --profile-steps: the trace is a valid Chrome/Perfetto JSON trace holding exactly the profiled steps
(ctest profile_trace).

Runs the demo config for 4 steps with --profile-steps 2-3 (checkpoint at step 2, γ-MoD on 2 layers), then checks the
rank-0 trace: the JSON object format Perfetto and chrome://tracing read (traceEvents; complete events with name, ph,
numeric ts/dur, pid, tid), gmod's ranges present with the counts two steps give (gmod::optimizer twice, one
gmod::checkpoint), MoD and dense layers and the routing inside a MoD layer's range, LibTorch operators. A bad range
is refused naming the key.

    python tests/trainer/check_profile.py --gmod build/bin/gmod
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gmod_train(gmod, run_dir, data_dir, extra):
    sets = ["model.path=configs/demo_model", f"run_dir={run_dir}", f"data.train={data_dir}/train.json",
            "eval.data=", "data.demo_records=64", "batch.micro_batch=2", "batch.global_batch=4",
            "schedule.max_steps=4", "checkpoint.every=2", "metrics.log_every=1", "mod.rule=keep_top:2",
            "resume=none"]
    cmd = [gmod, "train", "--config", os.path.join(ROOT, "configs/demo.json"), "--threads", "1"] + extra
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gmod", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="gmod-profile-")
    try:
        run_dir, data_dir = os.path.join(work, "run"), os.path.join(work, "data")
        bad = gmod_train(args.gmod, run_dir + "-bad", data_dir, ["--profile-steps", "3-2"])
        assert bad.returncode != 0 and "metrics.profile_steps" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
        r = gmod_train(args.gmod, run_dir, data_dir, ["--profile-steps", "2-3"])
        if r.returncode != 0:
            sys.exit(f"gmod train failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        traces = glob.glob(os.path.join(run_dir, "profile", "trace-rank-*-steps-*.json"))
        assert [os.path.basename(t) for t in traces] == ["trace-rank-0-steps-2-3.json"], traces
        trace = json.load(open(traces[0]))
        events = trace["traceEvents"]
        assert isinstance(events, list) and events, "no traceEvents"
        complete = [e for e in events if e.get("ph") == "X"]
        for e in complete:
            assert isinstance(e.get("name"), str) and isinstance(e.get("ts"), (int, float)), e
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            assert "pid" in e and "tid" in e, e
        names = {}
        for e in complete:
            names.setdefault(e["name"], []).append(e)
        count = lambda n: len(names.get(n, []))
        for n in ("gmod::data_wait", "gmod::forward", "gmod::backward", "gmod::reduce", "gmod::mod_layer",
                  "gmod::decoder_layer", "gmod::mod_routing"):
            assert count(n) >= 2, f"{n}: {count(n)} events (want one or more per profiled step)"
        assert count("gmod::optimizer") == 2, f"gmod::optimizer {count('gmod::optimizer')} times, want 2 (steps 2, 3)"
        assert count("gmod::checkpoint") == 1, f"gmod::checkpoint {count('gmod::checkpoint')} times, want 1 (step 2)"
        aten = [n for n in names if n.startswith("aten::")]
        assert any(n in names for n in ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")), sorted(aten)[:20]
        # Every MoD routing range lies inside a MoD layer's range (same thread).
        layers = names["gmod::mod_layer"]
        for e in names["gmod::mod_routing"]:
            assert any(l["tid"] == e["tid"] and l["ts"] <= e["ts"] and e["ts"] + e["dur"] <= l["ts"] + l["dur"] + 1
                       for l in layers), f"mod_routing at {e['ts']} outside every mod_layer"
        print(f"OK: {traces[0]}: {len(events)} events, {len(aten)} LibTorch operator names, gmod ranges "
              + ", ".join(f"{n} x{count(n)}" for n in sorted(names) if n.startswith("gmod::")))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

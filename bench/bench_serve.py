#!/usr/bin/env python3
"""Served throughput of `gmod serve`, dense against γ-MoD of the same model: for concurrency 1, 4 and 16 it
prints completion tokens/s, p50 and p99 request latency and the γ-MoD / dense ratios. Standard library only;
loopback only; each server is started on a free port and stopped at the end.

  python3 bench/bench_serve.py --gmod build/bin/gmod -- --model configs/demo_model --random-init 0 \\
      --tokenizer tests/fixtures/tokenizer/sp/tokenizer.model --threads 2

The γ-MoD server is the same command with --mod RULE appended (default layers:2,3, the demo's), unless
--mod-model DIR names a converted γ-MoD dir. --hidden H --layers N serve a copy of the --model dir's config
scaled to that size (random weights: use with --random-init) so that the model's compute, not HTTP and
per-step overhead, dominates. Greedy decoding; every request asks --max-tokens tokens. Only prompts whose
answers run to --max-tokens on both models are sent (probed first), so that both do the same work and their
latencies compare. `run_load` is also the load generator of tests/serve/serve_load_test.py.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

PROMPTS = ["Hello there", "Name a colour of the rainbow, and say in a few words why you like it.", "Count.",
           "What is two plus two?", "Write one short sentence about the sea.", "List three animals.",
           "Tell me a long story.", "Describe a day at the beach.", "Why is the sky blue?", "Say something."]


class ServeProcess:
    """`gmod serve --port 0 ARGS` until close(); the port is read from its "listening on" line."""

    def __init__(self, gmod, args, timeout=300):
        cmd = [gmod, "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, port, ready = [], [], threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    port.append(int(m.group(1)))
                    ready.set()
            ready.set()
        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or not port:
            self.close()
            raise RuntimeError("gmod serve did not start: " + " ".join(cmd) + "\n" + "".join(self.lines))
        self.base = f"http://127.0.0.1:{port[0]}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def chat(base, prompt, max_tokens, key=None, timeout=600):
    """(answer text, completion tokens, seconds) of one greedy request."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        j = json.loads(r.read())
    return j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"], time.perf_counter() - t0


def percentile(xs, q):
    """Nearest-rank percentile (q in [0, 100])."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))]


def run_load(base, prompts, concurrency, max_tokens, key=None, deadline_s=600):
    """Sends every prompt of `prompts` (in order), `concurrency` at a time. Returns (results, wall seconds):
    results[i] = (text, tokens, seconds) of prompts[i]."""
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        futures = [ex.submit(chat, base, p, max_tokens, key, deadline_s) for p in prompts]
        results = [f.result(timeout=deadline_s) for f in futures]
    return results, time.perf_counter() - t0


def summary(results, wall):
    lat = [r[2] for r in results]
    tokens = sum(r[1] for r in results)
    return {"requests": len(results), "tokens": tokens, "tokens_per_s": tokens / wall,
            "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99), "wall_s": wall}


def scaled_model(model_dir, hidden, layers, out):
    """A copy of model_dir's config.json with the LLM's hidden size, MLP width and layer count changed."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    t = cfg.get("text_config", cfg)
    heads = max(1, hidden // 64)
    t.update(hidden_size=hidden, intermediate_size=int(hidden * 8 / 3) // 16 * 16, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--mod", default="layers:2,3", help="--mod rule appended for the γ-MoD server")
    ap.add_argument("--mod-model", help="a converted γ-MoD dir instead of --mod (replaces --model)")
    ap.add_argument("--hidden", type=int, help="serve --model's config scaled to this hidden size (random init)")
    ap.add_argument("--layers", type=int, help="... and this many layers")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level (at least 2x it)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("model_args", nargs="+", help="gmod serve's model options (after --)")
    a = ap.parse_args()
    levels = [int(c) for c in a.concurrency.split(",")]
    tmp = tempfile.mkdtemp(prefix="gmod-bench-serve-")
    try:
        dense_args = list(a.model_args)
        if a.hidden or a.layers:
            i = dense_args.index("--model")
            base = os.path.join(dense_args[i + 1], "config.json")
            with open(base) as f:
                t = json.load(f)
            t = t.get("text_config", t)
            dense_args[i + 1] = scaled_model(dense_args[i + 1], a.hidden or t["hidden_size"],
                                             a.layers or t["num_hidden_layers"], tmp)
        if a.mod_model:
            i = dense_args.index("--model")
            mod_args = dense_args[:i + 1] + [a.mod_model] + dense_args[i + 2:]
        else:
            mod_args = dense_args + ["--mod", a.mod]
        serve_opts = ["--max-batch", str(a.max_batch), "--max-queue", "256", "--max-new-tokens", str(a.max_tokens)]
        servers = {name: ServeProcess(a.gmod, margs + serve_opts) for name, margs in [("dense", dense_args),
                                                                                       ("γ-MoD", mod_args)]}
        try:
            # Probe (and warm up): the prompts answered to max_tokens by both models.
            full = [p for p in PROMPTS if all(chat(s.base, p, a.max_tokens)[1] == a.max_tokens
                                              for s in servers.values())]
            if not full:
                print("no prompt runs to --max-tokens on both models: answers end at EOS, latencies differ in work")
                full = PROMPTS
            figures, skip = {}, {}
            for name, server in servers.items():
                for c in levels:
                    n = max(a.requests, 2 * c)
                    results, wall = run_load(server.base, [full[i % len(full)] for i in range(n)], c, a.max_tokens)
                    figures[(name, c)] = summary(results, wall)
            joins = {}
            for name, server in servers.items():
                with urllib.request.urlopen(server.base + "/metrics", timeout=60) as r:
                    text = r.read().decode()
                m = re.search(r"gmod_mod_skip_ratio ([0-9.]+)", text)
                skip[name] = float(m.group(1)) if m else 0.0
                m = re.search(r"gmod_joins_total ([0-9]+)", text)  # continuous batching (absent before it)
                joins[name] = int(m.group(1)) if m else None
        except Exception:
            for name, s in servers.items():  # what a server said before a request failed (e.g. it died)
                print(f"--- {name} server output (last lines):\n" + "".join(s.lines[-20:]), file=sys.stderr)
            raise
        finally:
            for s in servers.values():
                s.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = f", hidden {a.hidden}, layers {a.layers}" if a.hidden or a.layers else ""
    print(f"gmod serve, greedy, max_tokens {a.max_tokens}, max batch {a.max_batch}{size}; "
          f"{len(full)} prompts answered to max_tokens by both; γ-MoD skip ratio {skip['γ-MoD']:.3f} "
          "(token slots of the MoD layers skipped)")
    if any(v is not None for v in joins.values()):
        print("requests that joined a running batch: " + ", ".join(f"{k} {v}" for k, v in joins.items()))
    print(f"{'model':>6} {'conc':>4} {'req':>4} {'tokens':>6} {'tok/s':>8} {'p50 s':>7} {'p99 s':>7}")
    for (name, c), f in figures.items():
        print(f"{name:>6} {c:>4} {f['requests']:>4} {f['tokens']:>6} {f['tokens_per_s']:>8.1f} "
              f"{f['p50_s']:>7.3f} {f['p99_s']:>7.3f}")
    for c in levels:
        d, m = figures[("dense", c)], figures[("γ-MoD", c)]
        print(f"concurrency {c}: γ-MoD / dense tokens/s {m['tokens_per_s'] / d['tokens_per_s']:.2f}, "
              f"p50 {m['p50_s'] / d['p50_s']:.2f}, p99 {m['p99_s'] / d['p99_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`gmod serve` keeps each request's cost bounded (ctest serve_bounds; issue 34 item 4):

- a body that is not JSON by its Content-Type: 415 unsupported_media_type; a body over 64 MiB: 413;
- max_tokens over --max-new-tokens: 400 naming max_tokens (refused, not clamped);
- prompt + max_tokens over the context with max_tokens within --max-new-tokens: 400 context_length_exceeded (one
  token less: 200);
- oversized text (one user message of BIG_MIB MiB, under the 64 MiB body limit): 400 context_length_exceeded from
  the cheap length bound (serve/prompt_bound.h) within SECONDS_BOUND seconds each, CONCURRENT at once; more large
  bodies than --max-large-bodies at once get 503 with Retry-After, refused by their Content-Length before they are
  read; the server's peak RSS grows by at most RSS_BOUND_MIB (independent of CONCURRENT) and its resident memory
  afterwards is within RSS_AFTER_MIB of before; /metrics counts the refusals;
- the server answers a normal request afterwards exactly as `gmod generate` does.

    python tests/serve/serve_bounds_test.py --gmod build/bin/gmod -- --model configs/demo_model --random-init 0
        --tokenizer tests/fixtures/tokenizer/sp/tokenizer.model --threads 1
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, MAX_NEW, Server, check, fail, generate  # noqa: E402

BIG_MIB = 40
CONCURRENT = 6
MAX_LARGE = 2
SECONDS_BOUND = 20.0
CONTEXT = 512  # configs/demo_model's max_position_embeddings
SERVER_MAX_NEW = 64
# A large body is refused by its Content-Length before it is read when the MAX_LARGE slots are taken (its bytes are
# read and dropped), so memory does not grow with CONCURRENT: each of the at most MAX_LARGE bodies handled at once
# costs the body, its JSON document, the request's copy of the text and the allocator's slack (about 4x the body);
# plus 256 MiB for the bound's work, the per-thread arenas and httplib's buffers.
RSS_BOUND_MIB = MAX_LARGE * 4 * BIG_MIB + 256
# Memory resident after the load, over what it was before it: the bodies' memory is handed back.
RSS_AFTER_MIB = 64

def post(server, body, content_type="application/json"):
    req = urllib.request.Request(server.base + "/v1/chat/completions", data=body, method="POST")
    req.add_header("Authorization", "Bearer " + API_KEY)
    if content_type:
        req.add_header("Content-Type", content_type)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, headers, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    try:
        return status, headers, json.loads(text), time.monotonic() - t0
    except ValueError:
        return status, headers, text, time.monotonic() - t0


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def chat(text, max_tokens):
    return json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}).encode()


def check_context_exceeded(server):
    """docs/serve.md: prompt + max_tokens over the context is 400 context_length_exceeded, also when max_tokens alone
    is within --max-new-tokens. A prompt of P tokens (CONTEXT - SERVER_MAX_NEW < P < CONTEXT, measured by the
    server's usage) with max_tokens CONTEXT - P + 1 is refused, with CONTEXT - P it is answered."""
    def prompt_tokens(text):
        st, _, j, _ = post(server, chat(text, 1))
        check(st == 200, f"a {len(text)}-character prompt with max_tokens 1: {st} {str(j)[:200]}")
        return j["usage"]["prompt_tokens"]
    p0, p100 = prompt_tokens("hello"), prompt_tokens("hello" + " word" * 100)
    n = int((CONTEXT - SERVER_MAX_NEW // 2 - p0) * 100 / (p100 - p0))
    text = "hello" + " word" * n
    p = prompt_tokens(text)
    check(CONTEXT - SERVER_MAX_NEW < p < CONTEXT, f"prompt of {p} tokens within {SERVER_MAX_NEW} of the context")
    over = CONTEXT - p + 1
    st, _, j, _ = post(server, chat(text, over))
    print(f"prompt {p} tokens + max_tokens {over} (--max-new-tokens {SERVER_MAX_NEW}), context {CONTEXT}: {st}",
          flush=True)
    check(st == 400 and j["error"]["code"] == "context_length_exceeded" and j["error"]["param"] == "messages"
          and f"the prompt ({p} tokens" in j["error"]["message"] and str(CONTEXT) in j["error"]["message"],
          f"prompt {p} + max_tokens {over} over the context {CONTEXT}: {st} {j}")
    st, _, j, _ = post(server, chat(text, over - 1))
    check(st == 200, f"prompt {p} + max_tokens {over - 1} fills the context exactly: {st} {str(j)[:200]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("model_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    args.model_args = [a for a in args.model_args if a != "--"]
    server = Server(args, ["--max-batch", "2", "--max-new-tokens", str(SERVER_MAX_NEW), "--max-large-bodies",
                                  str(MAX_LARGE)])
    try:
        small = json.dumps({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}).encode()
        st, _, j, _ = post(server, small, "text/plain")
        check(st == 415 and j["error"]["code"] == "unsupported_media_type", f"text/plain body: {st} {j}")
        st, _, j, _ = post(server, small, "application/json; charset=utf-8")
        check(st == 200, f"application/json with a charset parameter is JSON: {st}")
        st, _, j, _ = post(server, json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                               "max_tokens": 1000}).encode())
        check(st == 400 and j["error"]["param"] == "max_tokens" and "--max-new-tokens" in j["error"]["message"],
              f"max_tokens 1000 over --max-new-tokens 64: {st} {j}")

        check_context_exceeded(server)
        st, _, j, _ = post(server, b" " * ((64 << 20) + 1))
        check(st == 413 and "over the server's limit" in j["error"]["message"],
              f"a body over the 64 MiB limit: {st} {str(j)[:200]}")

        # One user message of BIG_MIB MiB of words: far beyond the demo model's context.
        words = ("the quick brown fox jumps over the lazy dog " * (BIG_MIB * 1024 * 1024 // 44 + 1))
        big = json.dumps({"messages": [{"role": "user", "content": words[:BIG_MIB << 20]}], "max_tokens": 4}).encode()
        pid = server.proc.pid
        hwm0, rss0 = rss_kib(pid, "VmHWM"), rss_kib(pid, "VmRSS")
        st, _, j, dt = post(server, big)
        check(st == 400 and j["error"]["code"] == "context_length_exceeded",
              f"one {BIG_MIB} MiB message: {st} {str(j)[:200]} in {dt:.2f} s")
        check(dt < SECONDS_BOUND, f"answered in {dt:.2f} s (bound {SECONDS_BOUND} s)")
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as ex:
            results = list(ex.map(lambda _: post(server, big), range(CONCURRENT)))
        statuses = sorted(r[0] for r in results)
        slowest = max(r[3] for r in results)
        print(f"{CONCURRENT} concurrent {BIG_MIB} MiB bodies: statuses {statuses}, slowest {slowest:.2f} s", flush=True)
        check(all(s in (400, 503) for s in statuses), "every oversized body answered 400 or 503")
        for st, headers, j, _ in results:
            if st == 503:
                check(headers.get("Retry-After") == "1" and j["error"]["code"] == "server_busy",
                      "a 503 says server_busy with Retry-After")
                break
        check(slowest < 3 * SECONDS_BOUND, f"slowest concurrent answer {slowest:.2f} s (bound {3 * SECONDS_BOUND} s)")
        hwm = rss_kib(pid, "VmHWM")
        growth = (hwm - hwm0) / 1024
        print(f"peak RSS {hwm0 / 1024:.0f} -> {hwm / 1024:.0f} MiB (+{growth:.0f}, bound {RSS_BOUND_MIB})", flush=True)
        check(growth <= RSS_BOUND_MIB, f"peak RSS grew by {growth:.0f} MiB (bound {RSS_BOUND_MIB} MiB)")
        time.sleep(0.5)  # the handler threads release their bodies after the answers are written
        rss = rss_kib(pid, "VmRSS")
        print(f"resident {rss0 / 1024:.0f} MiB before the large bodies, {rss / 1024:.0f} MiB after "
              f"(bound +{RSS_AFTER_MIB})", flush=True)
        check(rss - rss0 <= RSS_AFTER_MIB * 1024,
              f"resident memory after the load grew by {(rss - rss0) / 1024:.0f} MiB (bound {RSS_AFTER_MIB} MiB)")
        m = server.metrics()
        check(m.get("gmod_refused_by_length_total", 0) >= 1 + statuses.count(400),
              f"/metrics counts the length refusals: {m.get('gmod_refused_by_length_total')}")
        check(m.get("gmod_large_bodies_in_flight") == 0, "no large body left in flight")

        want = generate(args, "hello", max_new=MAX_NEW)
        st, _, j, _ = post(server, json.dumps({"messages": [{"role": "user", "content": "hello"}],
                                               "max_tokens": MAX_NEW}).encode())
        check(st == 200 and j["choices"][0]["message"]["content"] == want,
              f"a normal request afterwards answers as gmod generate: {str(j)[:200]}")
    finally:
        server.close()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

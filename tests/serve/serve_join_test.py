#!/usr/bin/env python3
"""Continuous batching of `gmod serve`, seen by the official openai client (on a free loopback port): a short
request sent while a long streaming one decodes joins the running batch, so it finishes while the long one is
still streaming (batch-at-a-time decoding would make it wait for the long one's end), and both answers equal
`gmod generate`'s (the independent oracle, one request at a time) and the short request served alone.
/metrics counts the join.

Usage: serve_join_test.py --gmod BIN -- MODEL_ARGS...
"""
import argparse
import os
import sys
import threading
import time

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing from this Python: run launch/setup.sh (it installs the pinned version)")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, MAX_NEW, Server, check, fail, generate  # noqa: E402

LONG = 400  # tokens of the long request (the demo model's context is 512)
LONG_PROMPT = "Tell me a long story."
SHORT_PROMPTS = ["Hello there", "Name a colour of the rainbow, and say in a few words why you like it."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("model_args", nargs="+")
    args = ap.parse_args()

    long_text = generate(args, LONG_PROMPT, max_new=LONG)
    want = {p: generate(args, p) for p in SHORT_PROMPTS}
    server = Server(args, ["--max-batch", "4", "--max-new-tokens", str(LONG)])
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        model = client.models.list().data[0].id

        def chat(prompt, max_tokens=MAX_NEW):
            r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=max_tokens, temperature=0)
            return r.choices[0].message.content, r.usage.completion_tokens

        alone = {p: chat(p)[0] for p in SHORT_PROMPTS}
        for p in SHORT_PROMPTS:
            check(alone[p] == want[p], f"{p!r} served alone equals gmod generate ({alone[p]!r})")
        m0 = server.metrics()

        # The long request streams in a thread; the short ones are sent once it has produced text.
        started, chunks, ended = threading.Event(), [], []

        def long_request():
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=LONG,
                temperature=0, stream=True)
            for c in stream:
                if c.choices and c.choices[0].delta.content:
                    chunks.append(c.choices[0].delta.content)
                    started.set()
            ended.append(time.time())
        t = threading.Thread(target=long_request, daemon=True)
        t.start()
        if not started.wait(120):
            fail("the long request produced no text")
        for p in SHORT_PROMPTS:
            got, n = chat(p)
            done_at = time.time()
            streamed = len("".join(chunks))
            check(not ended, f"{p!r} finished while the long request was still decoding (it joined; the long one had "
                  f"streamed {streamed} of {len(long_text)} characters)")
            check(got == want[p] and got == alone[p],
                  f"{p!r} sent while the long request decodes equals gmod generate and itself served alone ({got!r})")
            check(n <= MAX_NEW and done_at > 0, f"{p!r}: {n} completion tokens")
        t.join(300)
        if t.is_alive():
            fail("the long request did not end")
        check("".join(chunks) == long_text, "the long request, joined by the others, equals gmod generate")
        m1 = server.metrics()
        joins = m1["gmod_joins_total"] - m0["gmod_joins_total"]
        check(joins >= len(SHORT_PROMPTS), f"/metrics counts the joins ({joins:.0f})")
        check(m1["gmod_active_requests"] == 0, "no request is left decoding")
    finally:
        server.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    main()

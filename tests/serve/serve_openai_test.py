#!/usr/bin/env python3
"""`gmod serve` against the official openai Python client (PyPI, pinned in launch/setup.sh) on a free loopback port.

The expected answers come from an independent path: `gmod generate` (the CLI's own prompt building and decoding,
one request at a time) on the same model and prompt, greedy. Checks: /v1/models, a text and an image chat
completion equal to gmod generate's output, stream=True, concurrent requests all answered correctly, and bad input
(malformed JSON, unknown field, missing messages, prompt over the context, oversized image, wrong model, wrong API
key, unknown route, queue full -> 429 with Retry-After), after which the server still answers. The server process
is always killed at the end.

Usage: serve_openai_test.py --gmod BIN --image PNG [--mod RULE] -- MODEL_ARGS...
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import sys

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing from this Python: run launch/setup.sh (it installs the pinned version)")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, MAX_NEW, Server, check, data_url, fail, generate, png  # noqa: E402

def expect_error(server, body, status, needle, param=None):
    got, headers, j = server.raw("/v1/chat/completions", body if isinstance(body, bytes) else json.dumps(body).encode())
    ok = got == status and isinstance(j, dict) and "error" in j and needle in j["error"]["message"]
    if param is not None:
        ok = ok and j["error"]["param"] == param
    check(ok, f"HTTP {status} '{needle}' (got {got}: {j})")
    return headers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("model_args", nargs="+")
    args = ap.parse_args()

    # Different lengths, so that batches are padded.
    prompts = ["Hello there", "Name a colour of the rainbow, and say in a few words why you like it.", "Count."]
    want = {p: generate(args, p) for p in prompts}
    image_prompt = "What colour is the circle?"
    want_image = generate(args, image_prompt, args.image)
    print("gmod generate:", want, repr(want_image), flush=True)

    server = Server(args, ["--max-batch", "4", "--max-queue", "4", "--max-new-tokens", "64",
                           "--max-image-pixels", "10000"])
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        check(model, f"/v1/models lists the served model ({model})")

        def chat(prompt, **kw):
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                  max_tokens=MAX_NEW, temperature=0, **kw)
        r = chat(prompts[0])
        check(r.choices[0].message.content == want[prompts[0]],
              f"text completion equals gmod generate ({r.choices[0].message.content!r})")
        check(r.usage.completion_tokens <= MAX_NEW and r.usage.prompt_tokens > 0, f"usage {r.usage}")

        with open(args.image, "rb") as f:
            img = f.read()

        def image_chat(prompt):
            return client.chat.completions.create(model=model, max_tokens=MAX_NEW, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(img)}}, {"type": "text", "text": prompt}]}])
        r = image_chat(image_prompt)
        check(r.choices[0].message.content == want_image,
              f"image completion equals gmod generate --image ({r.choices[0].message.content!r})")

        chunks = list(chat(prompts[0], stream=True, stream_options={"include_usage": True}))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        text = "".join(pieces)
        check(text == want[prompts[0]], f"stream=True gives the same text ({text!r})")
        # Streamed as decoded, not at the end: the HTTP thread writes whatever text the decoder produced since its last
        # write, so on a loaded machine neighbouring tokens share a chunk (2 chunks for this 8-token answer were seen
        # under a full ctest run); a single chunk would mean the text waited for the finish.
        check(len(pieces) >= 2, f"streamed in {len(pieces)} content chunks ({pieces})")
        check(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
        check([c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length"), "finish chunk")
        check(not chunks[-1].choices and chunks[-1].usage.completion_tokens >= len(pieces),
              f"include_usage: a last chunk with the usage ({chunks[-1].usage})")

        # Concurrent: as many as the queue holds (texts of different lengths and an image), every answer correct.
        order = [*prompts, image_prompt]
        with cf.ThreadPoolExecutor(len(order)) as ex:
            got = list(ex.map(lambda p: (image_chat(p) if p == image_prompt else chat(p)).choices[0].message.content,
                              order))
        check(got == [want[p] for p in prompts] + [want_image], f"{len(order)} concurrent requests all answered correctly")

        # Bad input: OpenAI's error shape, the right code; the server keeps serving.
        expect_error(server, b"{\"messages\": [", 400, "not valid JSON")
        expect_error(server, {"model": model, "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1},
                     400, "unknown field 'frobnicate'", "frobnicate")
        expect_error(server, {"model": model}, 400, "'messages' is required", "messages")
        expect_error(server, {"messages": [{"role": "user", "content": "word " * 600}]}, 400, "over the model's context")
        big = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(png(200, 200))}}, {"type": "text", "text": "hi"}]}]}
        expect_error(server, big, 400, "more than the decoded-pixel limit of 10000")
        expect_error(server, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,@@@@"}}]}]}, 400, "bad base64")
        expect_error(server, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "not served")
        try:
            openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0).models.list()
            fail("a wrong API key was accepted")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "wrong API key -> 401")
        status, _, j = server.raw("/v1/nothing")
        check(status == 404 and "error" in j, f"unknown route -> 404 JSON ({j})")
        status, _, j = server.raw("/health", key=None)
        check(status == 200 and j == {"status": "ok"}, "/health without a key")

        # Queue full: 16 at once against a queue of 4 and batches of 4 (64 tokens each): some get 429 with
        # Retry-After; those answered are correct.
        body = json.dumps({"model": model, "max_tokens": 64, "temperature": 0,
                           "messages": [{"role": "user", "content": prompts[2]}]}).encode()
        with cf.ThreadPoolExecutor(16) as ex:
            results = list(ex.map(lambda _: server.raw("/v1/chat/completions", body), range(16)))
        codes = [s for s, _, _ in results]
        check(429 in codes and all(c in (200, 429) for c in codes), f"queue full -> 429 ({codes})")
        check(all(h.get("Retry-After") == "1" for s, h, _ in results if s == 429), "429 carries Retry-After")
        answers = {j["choices"][0]["message"]["content"] for s, _, j in results if s == 200}
        check(len(answers) == 1 and next(iter(answers)).startswith(want[prompts[2]]),
              f"the {codes.count(200)} answered requests agree with gmod generate")

        w = want[prompts[0]]
        if len(w) >= 4:  # a stop string from inside the answer cuts it where it first occurs
            r = chat(prompts[0], stop=[w[2:4]])
            check(r.choices[0].message.content == w[:w.find(w[2:4])] and r.choices[0].finish_reason == "stop",
                  f"stop string cuts the answer ({r.choices[0].message.content!r})")
        status, _, metrics = server.raw("/metrics")
        check(status == 200 and re.search(r"gmod_requests_completed_total [1-9]", metrics) and
              "gmod_mod_skip_ratio" in metrics and "gmod_queue_length 0" in metrics, "metrics")
        print(metrics, flush=True)
        check(int(re.search(r"gmod_max_batch_size (\d+)", metrics).group(1)) >= 2, "requests were decoded in batches")
        check(server.proc.poll() is None, "the server is still running after the bad input")
    finally:
        server.close()
    print("PASS", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`gmod serve` with clients that misbehave, on a free loopback port; standard library only.

- A streaming client that reads its first chunk and closes its socket: the server cancels the request (metrics
  gmod_requests_cancelled_total), its batch ends early instead of running to max_tokens, and the next request
  is answered correctly (equal to `gmod generate`, the independent oracle).
- A queued request whose client closes before it runs (--max-batch 1, behind a long streaming request): dropped
  unrun (cancelled, and no batch is decoded for it).
- A client that sends a streaming request and never reads: another request is still answered correctly.
- Local image paths: refused outside --allowed-image-dir (also via '..' and a symbolic link), and an image
  under it gives the same answer as `gmod generate --image`.

Usage: serve_clients_test.py --gmod BIN --image PNG -- MODEL_ARGS...
"""
import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, MAX_NEW, Server, check, fail, generate  # noqa: E402

LONG = 400  # tokens of the long requests (the demo model's context is 512)
PROMPT = "Tell me a long story."


def body(prompt, max_tokens, stream=False, image=None):
    content = prompt if image is None else [{"type": "image_url", "image_url": {"url": image}},
                                            {"type": "text", "text": prompt}]
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream}).encode()


def open_request(server, payload, rcvbuf=None):
    """A raw socket that has sent POST /v1/chat/completions with `payload` (nothing read yet)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(120)
    s.connect(("127.0.0.1", server.port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    s.sendall(head.encode() + payload)
    return s


def read_until(s, needle, data=b""):
    while needle not in data:
        got = s.recv(4096)
        if not got:
            fail(f"the server closed before {needle!r}: {data[-300:]!r}")
        data += got
    return data


def wait_for(cond, seconds, what):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    fail(f"not within {seconds} s: {what}")


def answer(server, prompt, max_tokens=MAX_NEW, image=None):
    status, _, j = server.raw("/v1/chat/completions", body(prompt, max_tokens, image=image))
    if status != 200:
        fail(f"HTTP {status}: {j}")
    return j["choices"][0]["message"]["content"], j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("model_args", nargs="+")
    args = ap.parse_args()

    want = generate(args, "Hello there")
    want_image = generate(args, "What colour is the circle?", args.image)
    # The precondition of the cancellation checks: the long request does not end by itself before LONG tokens.
    long_text = generate(args, PROMPT, max_new=LONG)
    allowed = tempfile.mkdtemp(prefix="gmod-serve-images-")
    outside = tempfile.mkdtemp(prefix="gmod-serve-outside-")
    server = None
    try:
        os.makedirs(os.path.join(allowed, "sub"))
        shutil.copy(args.image, os.path.join(allowed, "sub", "circle.png"))
        shutil.copy(args.image, os.path.join(outside, "secret.png"))
        os.symlink(os.path.join(outside, "secret.png"), os.path.join(allowed, "link.png"))
        server = Server(args, ["--max-batch", "1", "--max-queue", "8", "--max-new-tokens", str(LONG),
                               "--allowed-image-dir", allowed, "--write-timeout", "3"])
        full, j = answer(server, PROMPT, LONG)
        check(full == long_text, "the long request equals gmod generate")
        if j["usage"]["completion_tokens"] < LONG:
            fail(f"precondition: the long answer ends by itself after {j['usage']['completion_tokens']} tokens")
        t0 = time.time()
        answer(server, PROMPT, LONG)
        long_s = time.time() - t0
        print(f"a {LONG}-token request takes {long_s:.2f} s", flush=True)
        # A batch's figures are added just after its answers went out: wait for both batches so far.
        wait_for(lambda: server.metrics()["gmod_batches_total"] >= 2, 30, "metrics of the first two batches")
        m0 = server.metrics()

        # 1. A streaming client gone after its first content chunk.
        s = open_request(server, body(PROMPT, LONG, stream=True))
        read_until(s, b'"content":"')
        t0 = time.time()
        s.close()
        wait_for(lambda: server.metrics()["gmod_requests_cancelled_total"] >= m0["gmod_requests_cancelled_total"] + 1,
                 60, "the closed stream's request is cancelled")
        got, _ = answer(server, "Hello there")
        check(got == want, f"after a client left mid-stream, the next answer equals gmod generate ({got!r})")
        wait_for(lambda: server.metrics()["gmod_batches_total"] >= m0["gmod_batches_total"] + 2, 30, "metrics")
        m1 = server.metrics()
        spent = m1["gmod_completion_tokens_total"] - m0["gmod_completion_tokens_total"]
        check(spent < LONG, f"the cancelled request's batch ended early ({spent:.0f} tokens decoded for it and the "
              f"next request, fewer than max_tokens {LONG}; closed {time.time() - t0:.2f} s ago)")
        check(m1["gmod_requests_completed_total"] == m0["gmod_requests_completed_total"] + 1,
              "the cancelled request is not counted as completed")

        # 2. A queued request whose client leaves before it runs: dropped, no batch for it.
        m0 = server.metrics()
        a = open_request(server, body(PROMPT, LONG, stream=True))
        head = read_until(a, b'"content":"')  # A decodes; B must wait (max batch 1)
        b = open_request(server, body("Hello there", MAX_NEW))
        time.sleep(0.1)
        b.close()
        data = read_until(a, b"data: [DONE]", head)
        a.close()
        wait_for(lambda: server.metrics()["gmod_requests_cancelled_total"] >= m0["gmod_requests_cancelled_total"] + 1,
                 30, "the queued request of the closed client is dropped")
        wait_for(lambda: server.metrics()["gmod_batches_total"] >= m0["gmod_batches_total"] + 1, 30, "A's batch")
        time.sleep(1.0)  # time enough for a batch of B's, were it decoded
        m1 = server.metrics()
        check(m1["gmod_batches_total"] == m0["gmod_batches_total"] + 1,
              f"the dropped request was not decoded (batches {m0['gmod_batches_total']} -> {m1['gmod_batches_total']})")
        events = [json.loads(line[6:]) for line in data.decode().split("\n") if line.startswith("data: {")]
        streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        if streamed != long_text:
            i = next((k for k in range(min(len(streamed), len(long_text))) if streamed[k] != long_text[k]), None)
            print("first difference at", i, repr(streamed[max(0, (i or 0) - 20):(i or 0) + 20]),
                  repr(long_text[max(0, (i or 0) - 20):(i or 0) + 20]), flush=True)
        check(streamed == long_text, "the stream that stayed got its whole answer, equal to gmod generate "
              f"({len(streamed)} of {len(long_text)} characters; last events {[e for e in events][-2:]})")

        # 3. A client that never reads its stream does not hold the server.
        slow = open_request(server, body(PROMPT, LONG, stream=True), rcvbuf=4096)
        time.sleep(0.2)
        t0 = time.time()
        got, _ = answer(server, "Hello there")
        check(got == want, f"a non-reading client does not stop others being answered ({time.time() - t0:.2f} s)")
        slow.close()

        # 4. Local image paths.
        got, _ = answer(server, "What colour is the circle?", image="sub/circle.png")
        check(got == want_image, f"an image path under --allowed-image-dir equals gmod generate --image ({got!r})")
        got, _ = answer(server, "What colour is the circle?", image="file://" + os.path.join(allowed, "sub/circle.png"))
        check(got == want_image, "the same as a file:// URL")
        for url, needle in [(os.path.join(outside, "secret.png"), "outside the allowed image folder"),
                            ("sub/../../" + os.path.basename(outside) + "/secret.png", "'..'"),
                            ("link.png", "symbolic link"), ("nothing.png", "does not exist")]:
            status, _, j = server.raw("/v1/chat/completions", body("What?", MAX_NEW, image=url))
            check(status == 400 and needle in j["error"]["message"] and "image_url" in j["error"]["param"],
                  f"image path {url!r} -> 400 '{needle}'")
        check(server.proc.poll() is None, "the server is still running")
    finally:
        if server:
            server.close()
        shutil.rmtree(allowed, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()

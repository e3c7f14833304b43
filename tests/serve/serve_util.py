"""Helpers of the `gmod serve` tests (tests/serve/*_test.py): a `gmod serve --port 0` process on loopback
(bench_serve.ServeProcess: its output pumped, its port read from the "listening on" line), raw HTTP requests,
`gmod generate`'s answer (the independent oracle) and a PNG writer. Standard library only.
"""
import base64
import json
import os
import re
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import zlib

# The server process is bench/bench_serve.py's (one launcher for the benchmark and the tests).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_serve import ServeProcess  # noqa: E402

API_KEY = "test-key-123"
MAX_NEW = 8


def fail(msg):
    print("FAIL:", msg, flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok:", msg, flush=True)


def generate(args, prompt, image=None, max_new=MAX_NEW):
    """gmod generate's greedy output text (everything after 'output: ' up to the MoD report or the end)."""
    cmd = [args.gmod, "generate", *args.model_args, "--prompt", prompt, "--max-new-tokens", str(max_new)]
    if image:
        cmd += ["--image", image]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        fail(f"gmod generate failed: {out.stderr}")
    text = out.stdout.split("output: ", 1)[1]
    # The line ends with "\n"; for γ-MoD models the skip-ratio report follows.
    return text.split("\nskip ratio: ", 1)[0] if "\nskip ratio: " in text else text[:-1]


def png(width, height):
    """A grey RGB PNG written with the standard library (an oversized image for the pixel limit)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\x80" * (3 * width) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def data_url(data):
    return "data:image/png;base64," + base64.b64encode(data).decode()


class Server(ServeProcess):
    """bench_serve's ServeProcess with the tests' API key; a server that does not start fails the test."""

    def __init__(self, args, extra):
        serve_args = [*args.model_args, "--api-key", API_KEY, *extra]
        print("starting:", args.gmod, "serve --port 0", " ".join(serve_args), flush=True)
        try:
            super().__init__(args.gmod, serve_args, timeout=180)
        except RuntimeError as e:
            fail(str(e))
        self.port = int(self.base.rsplit(":", 1)[1])

    def close(self):
        super().close()
        print("".join(self.lines[-5:]), flush=True)

    def metrics(self):
        """/metrics as {name: value}."""
        _, _, text = self.raw("/metrics")
        return {k: float(v) for k, v in re.findall(r"^(gmod_\w+) ([0-9.eE+-]+)$", text, re.M)}

    def raw(self, path, body=None, key=API_KEY):
        """(status, headers, parsed JSON or text) of a raw HTTP request."""
        req = urllib.request.Request(self.base + path, data=body, method="POST" if body is not None else "GET")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                status, headers, text = r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            status, headers, text = e.code, e.headers, e.read().decode()
        try:
            return status, headers, json.loads(text)
        except ValueError:
            return status, headers, text



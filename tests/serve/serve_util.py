"""Helpers of the `gmod serve` tests (tests/serve/*_test.py): a `gmod serve --port 0` process on loopback with
its output pumped and its port read from the "listening on" line, raw HTTP requests, `gmod generate`'s answer
(the independent oracle) and a PNG writer. Standard library only.
"""
import json
import re
import struct
import subprocess
import threading
import urllib.error
import urllib.request
import zlib
import base64

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


class Server:
    def __init__(self, args, extra):
        cmd = [args.gmod, "serve", *args.model_args, "--port", "0", "--api-key", API_KEY, *extra]
        print("starting:", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        port = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    port.append(int(m.group(1)))
                    ready.set()
            ready.set()
        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(180) or not port:
            self.close()
            fail("gmod serve did not start listening:\n" + "".join(self.lines))
        self.port = port[0]
        self.base = f"http://127.0.0.1:{self.port}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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



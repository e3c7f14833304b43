#!/usr/bin/env python3
"""`gmod generate --print-ids` on the tiny random LLaVA-NeXT (tests/fixtures/llava_next/data/model) with one AnyRes
image per case of tests/fixtures/llava_next/data/generate.json (tests/fixtures/make_llava_next_fixtures.py
--data-generate): the prompt ids (the image's base + unpadded grid + newline tokens) equal LlavaNextProcessor's and
the greedy ids equal transformers' generate (the prefill packs the tiles with the prompt's image_sizes).

Usage: check_llava_next_generate.py --gmod BIN --root REPO
"""
import argparse
import json
import os
import re
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def ids_line(stdout, name):
    m = re.search(rf"^{name} ids: ?(.*)$", stdout, re.M)
    if not m:
        fail(f"no '{name} ids:' line")
    return [int(x) for x in m.group(1).split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    data = os.path.join(args.root, "tests/fixtures/llava_next/data")
    with open(os.path.join(data, "generate.json")) as f:
        ref = json.load(f)
    for case in ref["cases"]:
        cmd = [args.gmod, "generate", "--model", os.path.join(data, "model"), "--threads", "1",
               "--template", "chatml", "--prompt", case["prompt"], "--max-new-tokens", str(ref["max_new_tokens"]),
               "--image", os.path.join(args.root, "tests/fixtures/image", case["image"]), "--print-ids"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print("$", " ".join(cmd), "\n" + out.stdout + out.stderr, flush=True)
        if out.returncode != 0:
            fail(f"{case['name']}: exit code {out.returncode}")
        if ids_line(out.stdout, "prompt") != case["input_ids"]:
            fail(f"{case['name']}: prompt ids differ from LlavaNextProcessor's")
        got = ids_line(out.stdout, "output")
        if got != case["output_ids"]:
            fail(f"{case['name']}: generated {got}, transformers generated {case['output_ids']}")
        print(f"ok: {case['name']}: {len(case['input_ids'])} prompt ids and {len(got)} greedy ids equal "
              "transformers'", flush=True)


if __name__ == "__main__":
    main()

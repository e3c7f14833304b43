#!/usr/bin/env python3
"""The inference commands on the tiny random LLaVA-NeXT (tests/fixtures/llava_next/data/model) with AnyRes images
(the model's image preparer, data/image_prep.h), one command per run:

  generate  `gmod generate --print-ids` on each case of tests/fixtures/llava_next/data/generate.json
            (tests/fixtures/make_llava_next_fixtures.py --data-generate): the prompt ids (the image's base + unpadded
            grid + newline tokens) equal LlavaNextProcessor's and the greedy ids equal transformers' generate.
  answer    `gmod answer` on two image questions of different tile counts in one right-padded batch (--batch 2):
            each answer equals `gmod generate`'s for the same question alone.
  eval      `gmod eval` on the fixture's training records: every record counted, a finite loss, exact match of the
            greedy first answers computed (each prompt's own tiles and image_sizes cut from the batch).
  serve     `gmod serve` answering a chat request with an image_url part: the content equals `gmod generate`'s
            for the same prompt (the parser writes the image as "<image>\\n" before the text).

Usage: check_llava_next_generate.py COMMAND --gmod BIN --root REPO --workdir DIR
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print("$", " ".join(cmd), "\n" + out.stdout + out.stderr, flush=True)
    if out.returncode != 0:
        fail(f"exit code {out.returncode}: {' '.join(cmd)}")
    return out.stdout


def ids_line(stdout, name):
    m = re.search(rf"^{name} ids: ?(.*)$", stdout, re.M)
    if not m:
        fail(f"no '{name} ids:' line")
    return [int(x) for x in m.group(1).split()]


def output_text(stdout):
    text = stdout.split("output: ", 1)[1]
    return text.split("\nskip ratio: ", 1)[0] if "\nskip ratio: " in text else text.split("\n", 1)[0]


def generate(args, prompt, image, max_new):
    return run([args.gmod, "generate", "--model", args.model, "--threads", "1", "--template", "chatml", "--prompt",
                prompt, "--max-new-tokens", str(max_new), "--image", os.path.join(args.images, image), "--print-ids"])


def check_generate(args):
    with open(os.path.join(args.data, "generate.json")) as f:
        ref = json.load(f)
    for case in ref["cases"]:
        out = generate(args, case["prompt"], case["image"], ref["max_new_tokens"])
        if ids_line(out, "prompt") != case["input_ids"]:
            fail(f"{case['name']}: prompt ids differ from LlavaNextProcessor's")
        got = ids_line(out, "output")
        if got != case["output_ids"]:
            fail(f"{case['name']}: generated {got}, transformers generated {case['output_ids']}")
        print(f"ok: {case['name']}: {len(case['input_ids'])} prompt ids and {len(got)} greedy ids equal "
              "transformers'", flush=True)


QUESTIONS = [{"question_id": "q0", "image": "land.jpg", "text": "<image>What is in the image?"},  # 5 tiles
             {"question_id": "q1", "image": "prog444.jpg", "text": "<image>Describe it."}]       # 3 tiles


def check_answer(args):
    qfile = os.path.join(args.workdir, "questions.jsonl")
    with open(qfile, "w") as f:
        for q in QUESTIONS:
            f.write(json.dumps(q) + "\n")
    afile = os.path.join(args.workdir, "answers.jsonl")
    run([args.gmod, "answer", "--model", args.model, "--threads", "1", "--template", "chatml", "--questions", qfile,
         "--images", args.images, "--answers", afile, "--batch", "2", "--max-new-tokens", "8"])
    with open(afile) as f:
        answers = {a["question_id"]: a for a in map(json.loads, f)}
    for q in QUESTIONS:
        a = answers.get(q["question_id"])
        if a is None or a.get("metadata", {}).get("problem"):
            fail(f"{q['question_id']}: no answer ({a})")
        alone = output_text(generate(args, q["text"], q["image"], 8)).strip()
        if a["text"] != alone:
            fail(f"{q['question_id']}: batched answer {a['text']!r}, gmod generate alone {alone!r}")
        print(f"ok: {q['question_id']}: batched answer equals gmod generate's ({alone!r})", flush=True)


def check_eval(args):
    data = os.path.join(args.workdir, "train.json")
    shutil.copyfile(os.path.join(args.data, "train.json"), data)
    out = run([args.gmod, "eval", "--model", args.model, "--threads", "1", "--template", "chatml", "--data", data,
               "--images", args.images, "--batch", "2", "--max-len", "256"])
    n = len(json.load(open(data)))
    m = re.search(r"(\d+) samples in (\d+) batches", out)
    if not m or int(m.group(1)) != n:
        fail(f"expected {n} samples")
    loss = float(re.search(r"^loss +([0-9.eE+-]+|nan|inf)", out, re.M).group(1))
    if not math.isfinite(loss):
        fail(f"loss {loss}")
    if not re.search(rf"^exact match +[0-9.]+ \(\d+/{n} first answers, greedy\)", out, re.M):
        fail(f"no exact match over the {n} first answers")
    print(f"ok: {n} records, loss {loss:.4f}, exact match over {n} first answers", flush=True)


def check_serve(args):
    sys.path.insert(0, os.path.join(args.root, "tests", "serve"))
    from serve_util import Server, data_url  # noqa: E402
    prompt = "What is in the image?"
    want = output_text(generate(args, "<image>\n" + prompt, "land.jpg", 8))
    with open(os.path.join(args.images, "land.jpg"), "rb") as f:
        img = f.read()
    server = Server(argparse.Namespace(gmod=args.gmod, model_args=["--model", args.model, "--threads", "1",
                                                                   "--template", "chatml"]), [])
    try:
        body = {"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(img).replace("image/png", "image/jpeg")}},
            {"type": "text", "text": prompt}]}]}
        status, _, j = server.raw("/v1/chat/completions", json.dumps(body).encode())
    finally:
        server.close()
    if status != 200:
        fail(f"HTTP {status}: {j}")
    got = j["choices"][0]["message"]["content"]
    if got != want:
        fail(f"served {got!r}, gmod generate {want!r}")
    print(f"ok: the served answer equals gmod generate's ({got!r})", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["generate", "answer", "eval", "serve"])
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    args.data = os.path.join(args.root, "tests/fixtures/llava_next/data")
    args.model = os.path.join(args.data, "model")
    args.images = os.path.join(args.root, "tests/fixtures/image")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    {"generate": check_generate, "answer": check_answer, "eval": check_eval, "serve": check_serve}[args.command](args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`gmod serve` with a FastV model dir (issue 20): a dense model converted with `gmod convert --rule fastv:K:R`,
served, answers the OpenAI client as `gmod generate` and `gmod answer` answer with that dir.

The dense model is a random-weight LLaVA dir (tests/cli/make_demo_dense.py). FastV drops image tokens at prefill,
so the checks ask about images: one request, a stream, and requests of different lengths at once (a padded batch in
which each sample keeps its own image tokens). The oracles are independent paths: `gmod generate` (one request, the
CLI's prompt) and `gmod answer` (LLaVA's question file, batched). That FastV is in force is checked from generate's
skip report (FastV's skips count as MoD skips), the dense model's different answers and the server's skip-ratio
metric.

Usage: serve_fastv_test.py --gmod BIN --dense DIR --images DIR --workdir DIR [--rule fastv:2:0.5]
(also run with --rule pdrop:LAYERS:RATIOS: a PyramidDrop dir, mod/pdrop.h, is served the same way)
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing from this Python: run launch/setup.sh (it installs the pinned version)")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, MAX_NEW, Server, check, data_url, fail, generate  # noqa: E402

QUESTIONS = [("heldout_000000.png", "What colour is the circle?"),
             ("heldout_000001.png", "How many shapes are there in this picture? Count them carefully."),
             ("heldout_000002.png", "Is the square on the left?")]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)}: exit code {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--dense", required=True, help="a dense model dir with weights and tokenizer")
    ap.add_argument("--images", required=True, help="the demo images (heldout_00000N.png)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rule", default="fastv:2:0.5")
    args = ap.parse_args()
    w = args.workdir
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    fastv = os.path.join(w, "fastv")
    out = run([args.gmod, "convert", "--model", args.dense, "--out", fastv, "--rule", args.rule])
    check("router " + args.rule.split(":")[0] in out, f"converted: {out.strip()}")  # fastv, or pdrop (PyramidDrop)
    args.model_args = ["--model", fastv, "--threads", "1"]

    images = [os.path.join(args.images, f) for f, _ in QUESTIONS]
    want = [generate(args, q, img) for img, (_, q) in zip(images, QUESTIONS)]
    print("gmod generate:", want, flush=True)
    report = run([args.gmod, "generate", *args.model_args, "--image", images[0], "--prompt", QUESTIONS[0][1],
                  "--max-new-tokens", str(MAX_NEW)])
    skip = float(re.search(r"skip ratio: MoD layers ([0-9.]+)", report).group(1))
    check(skip > 0, f"FastV skips image tokens in generate (MoD layers' skip ratio {skip})")
    fastv_args = args.model_args
    args.model_args = ["--model", args.dense, "--threads", "1"]
    dense = [generate(args, q, img) for img, (_, q) in zip(images, QUESTIONS)]
    args.model_args = fastv_args
    check(dense != want, f"the dense model answers otherwise ({dense}), so a server without FastV would show")

    # gmod answer: LLaVA's question file, all three in one batch.
    qfile, afile = os.path.join(w, "questions.jsonl"), os.path.join(w, "answers.jsonl")
    with open(qfile, "w") as f:
        for i, (img, q) in enumerate(QUESTIONS):
            f.write(json.dumps({"question_id": i, "image": img, "text": q}) + "\n")
    run([args.gmod, "answer", *args.model_args, "--questions", qfile, "--images", args.images, "--answers", afile,
         "--batch", "3", "--max-new-tokens", str(MAX_NEW), "--stats", "-"])
    with open(afile) as f:
        answered = {a["question_id"]: a["text"] for a in map(json.loads, f)}
    print("gmod answer:", answered, flush=True)

    server = Server(args, ["--max-batch", "4", "--max-new-tokens", "64"])
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        pngs = []
        for img in images:
            with open(img, "rb") as f:
                pngs.append(f.read())

        def ask(i, **kw):
            return client.chat.completions.create(model=model, max_tokens=MAX_NEW, temperature=0, **kw, messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(pngs[i])}},
                                             {"type": "text", "text": QUESTIONS[i][1]}]}])
        r = ask(0)
        check(r.choices[0].message.content == want[0], f"an image question equals gmod generate ({want[0]!r})")
        chunks = list(ask(0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(text == want[0], f"stream=True gives the same text ({text!r})")
        with cf.ThreadPoolExecutor(len(QUESTIONS)) as ex:
            got = list(ex.map(lambda i: ask(i).choices[0].message.content, range(len(QUESTIONS))))
        check(got == want, f"{len(QUESTIONS)} concurrent image questions equal gmod generate ({got})")
        check(got == [answered[i] for i in range(len(QUESTIONS))], "and gmod answer's batched answers")
        status, _, metrics = server.raw("/metrics")
        m = re.search(r"gmod_mod_skip_ratio ([0-9.eE+-]+)", metrics)
        check(status == 200 and m and float(m.group(1)) > 0, f"the server reports FastV's skips ({m and m.group(0)})")
        check(server.proc.poll() is None, "the server is still running")
    finally:
        server.close()
    print("all checks passed")


if __name__ == "__main__":
    main()

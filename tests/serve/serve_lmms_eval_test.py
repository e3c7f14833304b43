#!/usr/bin/env python3
"""lmms-eval (PyPI, pinned; its own venv made by launch/setup.sh) evaluates `gmod serve` through its
openai_compatible model on a tiny local task in its YAML format (tests/serve/lmms_eval_task/: images of the
build's demo data with questions). The real command line is run: `python -m lmms_eval --model
openai_compatible --tasks gmod_shapes --include_path ...`, reaching the server through OPENAI_API_BASE and
OPENAI_API_KEY as lmms-eval documents. Checks: lmms-eval finishes, every logged response equals `gmod generate
--image` on the same image and question (the independent oracle), and the results file holds the task's
exact_match (one document's target is the oracle's answer: 1/3).

Usage: serve_lmms_eval_test.py --gmod BIN --images DIR -- MODEL_ARGS...
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import API_KEY, Server, check, fail, generate  # noqa: E402

TASK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmms_eval_task")
QUESTIONS = ["What colour is the shape?", "What shape is in the image?", "Is the shape on the left or the right?"]
MAX_NEW = 8  # the task's generation_kwargs.max_new_tokens


def lmms_python():
    """The lmms-eval venv's python, recorded by launch/setup.sh in the venv running this test."""
    marker = os.path.join(sys.prefix, "lmms-eval-python")
    if not os.path.exists(marker):
        fail(f"{marker} is missing: run launch/setup.sh (it makes the lmms-eval venv)")
    with open(marker) as f:
        return f.read().strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--images", required=True, help="a folder of PNG images (the demo data's)")
    ap.add_argument("model_args", nargs="+")
    args = ap.parse_args()
    python = lmms_python()
    images = sorted(glob.glob(os.path.join(args.images, "*.png")))[:3]
    if len(images) < 3:
        fail(f"fewer than 3 PNG images in {args.images}")
    docs = [{"id": i, "image": img, "question": q, "answer": "red"}
            for i, (img, q) in enumerate(zip(images, QUESTIONS))]
    want = {d["id"]: generate(args, d["question"], d["image"], max_new=MAX_NEW) for d in docs}
    docs[0]["answer"] = want[0]  # so that the scored exact_match (1/3) shows lmms-eval scored what it got
    print("gmod generate:", want, flush=True)

    work = tempfile.mkdtemp(prefix="gmod-lmms-eval-")
    server = None
    try:
        task = os.path.join(work, "task")
        shutil.copytree(TASK_DIR, task, ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(task, "data.jsonl"), "w") as f:
            for d in docs:
                f.write(json.dumps(d) + "\n")
        server = Server(args, ["--name", "gmod-demo", "--max-new-tokens", "32"])
        env = dict(os.environ, OPENAI_API_BASE=server.base + "/v1", OPENAI_API_KEY=API_KEY,
                   HF_HOME=os.path.join(work, "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
        out = os.path.join(work, "out")
        cmd = [python, "-m", "lmms_eval", "--model", "openai_compatible", "--model_args",
               "model=gmod-demo,num_concurrent=3,max_retries=1,timeout=120", "--tasks", "gmod_shapes",
               "--include_path", task, "--batch_size", "1", "--log_samples", "--output_path", out]
        print("running:", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, cwd=task, env=env, capture_output=True, text=True, timeout=900)
        print(r.stdout[-3000:], r.stderr[-6000:], sep="\n", flush=True)
        check(r.returncode == 0, f"lmms-eval exits 0 (got {r.returncode})")
        samples = glob.glob(os.path.join(out, "**", "*samples_gmod_shapes*.jsonl"), recursive=True)
        check(len(samples) == 1, f"lmms-eval logged the task's samples ({samples})")
        with open(samples[0]) as f:
            logged = [json.loads(line) for line in f if line.strip()]
        check(len(logged) == len(docs), f"{len(logged)} samples logged for {len(docs)} documents")
        for s in logged:
            resp = s["filtered_resps"]  # a string in 0.7.3's log; a list of them in older versions
            while isinstance(resp, list):
                resp = resp[0]
            doc_id = s["doc_id"]  # the line of data.jsonl, whose "id" is that line's index
            check(resp == want[doc_id], f"document {doc_id}: lmms-eval's response equals gmod generate ({resp!r})")
        results = glob.glob(os.path.join(out, "**", "*results*.json"), recursive=True)
        check(results, "lmms-eval wrote its results file")
        with open(results[0]) as f:
            res = json.load(f)["results"]["gmod_shapes"]
        em = [v for k, v in res.items() if k.startswith("exact_match")]
        expected = sum(want[d["id"]].strip().lower() == d["answer"].strip().lower() for d in docs) / len(docs)
        check(em and abs(em[0] - expected) < 1e-9, f"exact_match {em} equals the oracle's {expected}")
        check(server.proc.poll() is None, "the server is still running")
    finally:
        if server:
            server.close()
        shutil.rmtree(work, ignore_errors=True)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""gmod's Hugging Face exports are repositories transformers' own tools take unedited (issue 34 item 1).

For each export directory given (written by `gmod export` from a training checkpoint):
  * AutoProcessor loads it as it is (tokenizer with its chat template and <image> token, CLIP image processor,
    LlavaProcessor settings) and builds, from a chat message holding an image and a question, exactly the prompt ids
    `gmod generate --print-ids` decodes (BOS, system prompt, the image expanded to its tokens, " ASSISTANT:");
  * --dense: LlavaForConditionalGeneration.generate (greedy, the export's generation_config) answers with the ids
    gmod generate answers with.
  * --mod: an export transformers has no model class for (γ-MoD, p-MoD by `gmod convert`, LLaVA-HR): answered
    through gmod's own modeling code instead. The processor's inputs are what gmod is fed: its prompt ids must equal
    gmod's exactly (above), and `gmod generate --pixel-values` on its pixel_values (written as raw float32) must
    answer with the ids gmod generate answers with from its own preprocessing of the image (docs/training.md).
  * --prompt-only: an export trained too little to answer (its greedy answer is the stop token): the prompt only.
  * --serve: `transformers serve` starts on the dense export (loopback, bounded) and answers a chat request.
Then the chat template of every gmod conversation template (`gmod data chat-template --template T`) is rendered by
transformers' apply_chat_template on the records of the fixtures made by the original code (tests/fixtures/chat:
the models' own chat templates; tests/fixtures/conversation: LLaVA's conversation.py), and must give their ids.

    python tests/launch/check_hf_export.py --gmod build/bin/gmod --dense RUN/hf-dense --mod RUN/hf \\
        --image DATA/images --workdir /tmp/hf-export-check

Exits 77 (ctest SKIP_RETURN_CODE) without transformers / sentencepiece (launch/setup.sh installs both).
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

try:
    import sentencepiece  # noqa: F401  (transformers reads tokenizer.model through it)
    import torch
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer, LlavaForConditionalGeneration
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUESTION = "What shape is in the picture? Answer briefly."
TEMPLATES = ["vicuna_v1", "plain", "chatml", "qwen2_5", "qwen3_vl", "llama3", "llama3_1", "mistral"]


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        print(out.stdout + out.stderr)
        raise SystemExit(f"FAIL: exit code {out.returncode}")
    return out.stdout


def gmod_generate(gmod, model, image, max_new, extra=()):
    out = run([gmod, "generate", "--model", model, "--image", image, "--prompt", QUESTION, "--max-new-tokens",
               str(max_new), "--print-ids", *extra])
    ids = {}
    for line in out.splitlines():
        for key in ("prompt ids: ", "output ids: "):
            if line.startswith(key):
                ids[key.split()[0]] = [int(t) for t in line[len(key):].split()]
    return ids["prompt"], ids.get("output", [])


def processor_inputs(model_dir, image):
    """The prompt both ways the processor is used: the rendered template passed with the image (llava-hf's model
    cards), and apply_chat_template tokenizing itself (what transformers serve does)."""
    proc = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(images=Image.open(image).convert("RGB"), text=text, return_tensors="pt")
    messages[0]["content"][0] = {"type": "image", "path": image}
    direct = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                      return_tensors="pt")
    return inputs, direct


def check_export(args, model_dir, dense, answers=True):
    failures = []
    inputs, direct = processor_inputs(model_dir, args.image)
    prompt, answer = gmod_generate(args.gmod, model_dir, args.image, args.max_new_tokens)
    for how, x in (("processor(text=apply_chat_template(...))", inputs), ("apply_chat_template(tokenize=True)", direct)):
        theirs = x["input_ids"][0].tolist()
        print(f"{model_dir}: {how}: {len(theirs)} ids, gmod {len(prompt)}")
        if theirs != prompt:
            failures.append(f"{model_dir}: {how}'s prompt ids differ from gmod generate's\n  transformers "
                            f"{theirs}\n  gmod         {prompt}")
    if not torch.equal(inputs["pixel_values"], direct["pixel_values"]):
        failures.append(f"{model_dir}: the two processor paths give different pixel values")
    if not answers:
        return failures
    if not answer:
        failures.append(f"{model_dir}: gmod's greedy answer is empty: an untrained export checks nothing here")
    if not dense:  # no transformers model class: the processor's pixels through gmod's own model
        px = os.path.join(args.workdir, os.path.basename(os.path.normpath(model_dir)) + ".pixel_values.f32")
        inputs["pixel_values"].to(torch.float32).contiguous().numpy().tofile(px)
        fed_prompt, fed = gmod_generate(args.gmod, model_dir, args.image, args.max_new_tokens, ["--pixel-values", px])
        print(f"{model_dir}: greedy answer from the processor's pixel_values {list(inputs['pixel_values'].shape)} "
              f"{fed}, from gmod's preprocessing {answer}")
        if fed_prompt != prompt or fed != answer:
            failures.append(f"{model_dir}: gmod's greedy answer from the processor's inputs differs: {fed}, from its "
                            f"own preprocessing {answer}")
    if dense:
        model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=args.max_new_tokens)
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        eos = model.generation_config.eos_token_id
        if eos in new:
            new = new[:new.index(eos)]
        print(f"{model_dir}: greedy answer transformers {new}, gmod {answer}")
        if answer and new != answer:
            failures.append(f"{model_dir}: greedy answers differ: transformers {new}, gmod {answer}")
    return failures


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_serve(args, model_dir):
    """`transformers serve` on the export: starts and answers one chat request (bounded, loopback)."""
    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    if not os.path.exists(exe):
        return [f"no transformers CLI beside {sys.executable}"]
    port = free_port()
    log = open(os.path.join(args.workdir, "serve.log"), "w")
    proc = subprocess.Popen([exe, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, HF_HUB_OFFLINE="1"))
    try:
        body = json.dumps({"model": model_dir, "max_tokens": 4, "stream": False,
                           "messages": [{"role": "user", "content": QUESTION}]}).encode()
        deadline = time.time() + args.serve_timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                return [f"transformers serve exited with {proc.returncode} (log {log.name})"]
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    reply = json.loads(r.read())
                print(f"transformers serve answered: {reply['choices'][0]['message']['content']!r}")
                return []
            except (OSError, ValueError):
                time.sleep(1)
        return [f"transformers serve gave no answer within {args.serve_timeout} s (log {log.name})"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def llava_preprocess(conversations):
    """LLaVA's record preprocessing (as gmod and the fixture generators do): a leading assistant turn and a trailing
    unanswered question dropped; the roles as chat messages. <image> placeholders stay in the text (the template
    moves them)."""
    turns = [dict(t) for t in conversations]
    if turns and turns[0]["from"] != "human":
        turns = turns[1:]
    if len(turns) % 2 == 1:
        turns = turns[:-1]
    return [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns]


def render_ids(tok, template, messages, image_id, image_seq_length):
    ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True)
    if not isinstance(ids, list):  # a BatchEncoding
        ids = ids["input_ids"]
    placeholder = tok.convert_tokens_to_ids("<image>")
    out = []
    for i in ids:
        out.extend([image_id] * image_seq_length if i == placeholder else [i])
    return out


def load_fixture_tokenizer(path):
    if path.endswith("tokenizer.model"):  # SentencePiece: as gmod's export describes it (LlamaTokenizer, legacy)
        d = os.path.join(ARGS.workdir, "sp_tokenizer")
        os.makedirs(d, exist_ok=True)
        shutil.copy(path, os.path.join(d, "tokenizer.model"))
        json.dump({"tokenizer_class": "LlamaTokenizer", "legacy": True, "add_bos_token": True,
                   "add_eos_token": False}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        path = d
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


def chat_templates(args):
    """The chat template gmod writes for every conversation template (`gmod data chat-template`)."""
    return {t: run([args.gmod, "data", "chat-template", "--template", t])[:-1] for t in TEMPLATES}


def check_templates(args, templates):
    failures, checked = [], 0
    chat = json.load(open(os.path.join(ROOT, "tests/fixtures/chat/cases.json")))
    conv = json.load(open(os.path.join(ROOT, "tests/fixtures/conversation/cases.json")))
    suites = []
    for case in chat["cases"]:
        tok_path = os.path.join(ROOT, "tests/fixtures/chat", chat["tokenizers"][case["template"]])
        suites.append((case["template"], tok_path, case.get("system"), case["record"], case["ids"],
                       chat["image_token_id"], chat["image_seq_length"]))
    for t in ("vicuna_v1", "plain"):
        for case in conv.get(t, []):
            suites.append((t, os.path.join(ROOT, "tests/fixtures", conv["tokenizer"]), None, case["record"],
                           case["ids"], conv["image_token_id"], conv["image_seq_length"]))
    toks = {}
    for t, tok_path, system, record, want, image_id, n_image in suites:
        if tok_path not in toks:
            toks[tok_path] = load_fixture_tokenizer(tok_path)
        tok = toks[tok_path]
        messages = llava_preprocess(record["conversations"])
        if system is not None:
            messages = [{"role": "system", "content": system}] + messages
        got = render_ids(tok, templates[t], messages, image_id, n_image)
        checked += 1
        if got != want:
            failures.append(f"chat template {t}, record {record.get('id')}: ids differ from the original's\n"
                            f"  template {got}\n  original {want}")
    print(f"chat templates: {checked} records of {len(set(s[0] for s in suites))} templates rendered, "
          f"{checked - len(failures)} equal to the originals' ids")
    return failures


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--gmod", required=True)
    ap.add_argument("--dense", action="append", default=[], help="an export of a dense checkpoint (repeatable)")
    ap.add_argument("--mod", action="append", default=[],
                    help="an export transformers has no model class for: γ-MoD, p-MoD, LLaVA-HR (repeatable)")
    ap.add_argument("--prompt-only", action="append", default=[],
                    help="an export too little trained to answer (2 steps): its processor prompt only (repeatable)")
    ap.add_argument("--image", required=True, help="a PNG/JPEG, or a folder (its first PNG by name)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--serve", action="store_true", help="also start `transformers serve` on the first --dense")
    ap.add_argument("--serve-timeout", type=float, default=120)
    ARGS = args = ap.parse_args()
    if os.path.isdir(args.image):
        pngs = sorted(f for f in os.listdir(args.image) if f.endswith(".png"))
        if not pngs:
            raise SystemExit(f"FAIL: no PNG in {args.image}")
        args.image = os.path.join(args.image, pngs[0])
    if os.path.isdir(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    failures = []
    for d in args.dense:
        failures += check_export(args, d, dense=True)
    for d in args.mod:
        failures += check_export(args, d, dense=False)
    for d in args.prompt_only:
        failures += check_export(args, d, dense=False, answers=False)
    templates = chat_templates(args)
    for d in args.dense + args.mod + args.prompt_only:  # the run's template (vicuna_v1 here) in the processor's form (no BOS), twice
        want = run([args.gmod, "data", "chat-template", "--template", "vicuna_v1", "--for-processor"])[:-1]
        if open(os.path.join(d, "chat_template.jinja")).read() != want or \
                json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"] != want:
            failures.append(f"{d}: chat_template.jinja / tokenizer_config.json's chat_template is not vicuna_v1's")
    failures += check_templates(args, templates)
    if args.serve and args.dense:
        failures += check_serve(args, args.dense[0])
    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Bad datasets and images: empty datasets, no usable record, too many unusable records (measured before
training), image headers beyond the decoded-pixel limit, image paths that leave the image folder, and ARank without
image samples, through `gmod data check`, `gmod train` and `gmod arank`. Interface: tests/badinput/run_corpus.py."""
import json
import os
import struct
import zlib


def tokenizer(ctx):
    return os.path.join(ctx.root, "tests/fixtures/tokenizer/sp/tokenizer.model")


def png_header_only(width, height):
    """A small PNG whose IHDR claims width x height (8-bit RGB) and whose pixel data is empty: decoding it would
    allocate width * height * 3 bytes before finding the data missing."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def image_record(rid, image):
    return {"id": rid, "image": image,
            "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A shape."}]}


def text_record(rid):
    return {"id": rid, "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]}


def train_config(ctx, name, data=None, **sections):
    cfg = {
        "model": {"path": os.path.join(ctx.root, "configs/demo_model"), "init": "random", "init_seed": 1},
        "data": {"train": os.path.join(ctx.demo_data, "train.json"), "image_folder": ctx.demo_data,
                 "tokenizer": tokenizer(ctx), "max_len": 128, "workers": 0},
        "batch": {"micro_batch": 1, "global_batch": 2},
        "schedule": {"max_steps": 1},
        "run_dir": os.path.join(ctx.tmp, "run_" + name),
    }
    cfg["data"].update(data or {})
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    return ctx.write(name + ".config.json", json.dumps(cfg))


def cases(ctx):
    c = []
    tok = tokenizer(ctx)
    with open(os.path.join(ctx.demo_data, "train.json")) as f:
        demo = json.load(f)
    demo_image = next(r["image"] for r in demo if "image" in r)

    def check(name, records_or_text, expect, extra=(), rc=1, fname=None):
        text = records_or_text if isinstance(records_or_text, str) else json.dumps(records_or_text)
        path = ctx.write(fname or name + ".json", text)
        c.append(dict(name=name, argv=["data", "check", path, "--images", ctx.demo_data, "--tokenizer", tok,
                                       "--image-tokens", "4"] + list(extra), expect=expect, rc=rc))

    # --- gmod data check: an empty dataset is an error, not "0 records, 0 with problems".
    check("data_check_empty_list", [], r"data_check_empty_list\.json: no records \(an empty dataset\)")
    check("data_check_empty_jsonl", "", r"data_check_empty_jsonl\.jsonl: empty record file \(expected a JSON list",
          rc=2, fname="data_check_empty_jsonl.jsonl")
    check("data_check_whitespace_only", "  \n\n", r"data_check_whitespace_only\.json: empty record file", rc=2)

    # --- the decoded-pixel limit, from the header: a 1 KB PNG claiming 20000 x 20000 (1.2 GB decoded).
    ctx.write("huge/images/huge.png", png_header_only(20000, 20000))
    huge_dir = os.path.join(ctx.tmp, "huge")
    for name, extra in (("data_check_png_20000x20000", []), ("data_check_png_20000x20000_no_decode", ["--no-decode"])):
        path = ctx.write(name + ".json", json.dumps([image_record("huge", "images/huge.png")]))
        c.append(dict(name=name, argv=["data", "check", path, "--images", huge_dir, "--tokenizer", tok,
                                       "--image-tokens", "4"] + extra, rc=1,
                      expect=r"record 0 \(id 'huge'\): image 'images/huge\.png': .*20000x20000 = 400000000 pixels, "
                             r"more than the decoded-pixel limit of 67108864.*\(image: 1\)"))
    check("data_check_max_image_pixels_flag", demo, r"32x32 = 1024 pixels, more than the decoded-pixel limit of 1000",
          extra=["--max-image-pixels", "1000"])
    check("data_check_max_image_pixels_zero", demo, r"--max-image-pixels", extra=["--max-image-pixels", "0"], rc=2)
    check("data_check_max_image_pixels_2pow64", demo, r"--max-image-pixels",
          extra=["--max-image-pixels", "18446744073709551616"], rc=2)

    # --- image paths must stay inside the image folder (checked on the text; the file outside exists).
    ctx.write("outside.png", png_header_only(8, 8))
    check("data_check_image_dotdot", [image_record("esc", "../outside.png")],
          r"record 0 \(id 'esc'\): image path '\.\./outside\.png' leaves the image folder.*\(image_path: 1\)")
    check("data_check_image_dotdot_deep", [image_record("esc2", "images/../../outside.png")],
          r"image path 'images/\.\./\.\./outside\.png' leaves the image folder")
    check("data_check_image_absolute", [image_record("abs", os.path.join(ctx.demo_data, demo_image))],
          r"record 0 \(id 'abs'\): image path '/.*' is absolute")
    check("data_check_image_nul", '[{"id": "nul", "image": "' + demo_image + '\\u0000../../x", "conversations": '
          '[{"from": "human", "value": "<image>\\nQ"}, {"from": "gpt", "value": "A"}]}]', r"contains a NUL byte")
    check("data_check_image_dotdot_no_decode", [image_record("esc3", "../outside.png")],
          r"leaves the image folder", extra=["--no-decode"])

    # --- gmod train: the data guard stops the run before training (and before ARank), naming counts per kind.
    all_bad = ctx.write("all_bad.json", json.dumps([image_record("m%d" % i, "images/missing.png") for i in range(8)]))
    c.append(dict(name="train_no_usable_record", argv=["train", "--config", train_config(ctx, "no_usable", {"train": all_bad})],
                  expect=r"data\.train: .*all_bad\.json: 8 of the first 8 of 8 records in training order are unusable "
                         r"\(100\.0%; image: 8\); none is usable"))
    c.append(dict(name="train_no_usable_record_fraction_1",
                  argv=["train", "--config", train_config(ctx, "no_usable_1", {"train": all_bad, "max_bad_fraction": 1})],
                  expect=r"none is usable, training would learn nothing"))
    some_bad = demo + [{"id": "noans%d" % i, "conversations": [{"from": "human", "value": "Q?"}]} for i in range(2)]
    some_bad_path = ctx.write("some_bad.json", json.dumps(some_bad))
    c.append(dict(name="train_bad_fraction_first_records",
                  argv=["train", "--config", train_config(ctx, "some_bad", {"train": some_bad_path})],
                  expect=r"2 of the first %d of %d records in training order are unusable .*no_answer: 2\), more than "
                         r"data\.max_bad_fraction = 0\.05" % (len(some_bad), len(some_bad))))
    empty = ctx.write("empty.json", "[]")
    c.append(dict(name="train_empty_dataset", argv=["train", "--config", train_config(ctx, "empty", {"train": empty})],
                  expect=r"data\.train: .*empty\.json: the dataset has no records"))
    c.append(dict(name="train_max_image_pixels_below_demo_images",
                  argv=["train", "--config", train_config(ctx, "pixels", {"max_image_pixels": 1000})],
                  expect=r"data\.train: .*(more than data\.max_bad_fraction|none is usable).*decoded-pixel limit of 1000"))
    c.append(dict(name="train_max_image_pixels_zero",
                  argv=["train", "--config", train_config(ctx, "pixels0", {"max_image_pixels": 0}), "--dry-run"],
                  expect=r"data\.max_image_pixels: 0, expected >= 1"))
    c.append(dict(name="train_preflight_records_zero",
                  argv=["train", "--config", train_config(ctx, "pre0", {"preflight_records": 0}), "--dry-run"],
                  expect=r"data\.preflight_records: 0, expected -1 \(all\) or >= 1"))
    escape = ctx.write("escape.json", json.dumps([image_record("e%d" % i, "../outside.png") for i in range(4)]))
    c.append(dict(name="train_image_paths_leave_folder",
                  argv=["train", "--config", train_config(ctx, "escape", {"train": escape, "image_folder": huge_dir})],
                  expect=r"image_path: 4\); none is usable.*\[image_path\] .*image path '\.\./outside\.png' leaves"))
    c.append(dict(name="train_eval_data_unusable",
                  argv=["train", "--config", train_config(ctx, "eval_bad", eval={"data": all_bad})],
                  expect=r"eval\.data: .*all_bad\.json: 8 of the first 8 of 8 records .* none is usable"))

    # --- ARank: no usable sample is a named error, never a loop.
    text_only = ctx.write("text_only.json", json.dumps([text_record("t%d" % i) for i in range(6)]))
    c.append(dict(name="train_arank_text_only",
                  argv=["train", "--config", train_config(ctx, "arank_text", {"train": text_only},
                                                          mod={"enabled": True, "rule": "keep_top:2"})],
                  expect=r"no sample usable for ARank among 6 records \(6 text-only, 0 bad.*ARank needs image samples"))
    model = ["--model", os.path.join(ctx.root, "configs/demo_model"), "--random-init", "0", "--tokenizer", tok]
    c.append(dict(name="arank_text_only", argv=["arank"] + model + ["--data", text_only, "--max-len", "128"],
                  expect=r"no sample usable for ARank among 6 records.*ARank needs image samples"))
    c.append(dict(name="arank_all_bad", argv=["arank"] + model + ["--data", all_bad, "--images", ctx.demo_data,
                                                                   "--max-len", "128"],
                  expect=r"no sample usable for ARank among 8 records \(0 text-only, 8 bad"))
    c.append(dict(name="arank_huge_image_header",
                  argv=["arank"] + model + ["--data", ctx.write("huge_arank.json", json.dumps(
                      [image_record("huge", "images/huge.png")])), "--images", huge_dir, "--max-len", "128"],
                  expect=r"no sample usable for ARank among 1 records \(0 text-only, 1 bad"))
    return c

#!/usr/bin/env python3
"""Writes a dense Hugging Face LLaVA dir with random weights: transformers' LlavaForConditionalGeneration built from a
config dir (configs/demo_model) and saved by save_pretrained, plus a tokenizer.model, so that commands which read a
model's weights from its dir (gmod convert, then generate/answer/serve on the converted dir) have a dense model to
start from. Used by ctest fixtures (tests/CMakeLists.txt); exits 77 (skip) without transformers.

    python tests/cli/make_demo_dense.py --config configs/demo_model --tokenizer tests/fixtures/tokenizer/sp/tokenizer.model \
        --out /tmp/demo-dense [--seed 0]
"""
import argparse
import os
import shutil
import sys

try:
    import torch
    from transformers import LlavaConfig, LlavaForConditionalGeneration
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a dir with a LLaVA config.json")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.model or tokenizer.json to copy into the dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = LlavaForConditionalGeneration(LlavaConfig.from_pretrained(args.config)).eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    shutil.copy(args.tokenizer, os.path.join(args.out, os.path.basename(args.tokenizer)))
    print("wrote", args.out)


if __name__ == "__main__":
    main()

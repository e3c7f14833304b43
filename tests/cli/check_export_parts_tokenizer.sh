#!/usr/bin/env bash
# gmod export of a run composed from parts: the vision tower's directory (a CLIP repository ships CLIP's own text
# tokenizer) gives only its preprocessor config; the tokenizer is the one the run trained with (data.tokenizer).
#   tests/cli/check_export_parts_tokenizer.sh GMOD WORK_DIR   (run from the repository root)
set -euo pipefail
gmod=$1 w=$2
rm -rf "$w" && mkdir -p "$w"
cp -r tests/fixtures/parts/vision "$w/vision"
echo '{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}' > "$w/vision/tokenizer.json"
"$gmod" train --config configs/tiny_parts.json --set model.vision="$w/vision" --set data.train="$w/data/train.json" \
  --set run_dir="$w/run" --set schedule.max_steps=1 --set checkpoint.every=1 --set mod.enabled=false \
  --set batch.global_batch=2 > "$w/train.log" 2>&1 || { tail -20 "$w/train.log"; exit 1; }
"$gmod" export --checkpoint "$w/run" --out "$w/hf"
[ ! -e "$w/hf/tokenizer.json" ] || { echo "FAIL: the CLIP directory's tokenizer.json was copied into the export"; exit 1; }
cmp -s tests/fixtures/tokenizer/sp/tokenizer.model "$w/hf/tokenizer.model" ||
  { echo "FAIL: the export's tokenizer.model is not the run's data.tokenizer"; exit 1; }
cmp -s "$w/vision/preprocessor_config.json" "$w/hf/preprocessor_config.json" ||
  { echo "FAIL: the export's preprocessor_config.json is not the vision tower's"; exit 1; }
echo "PASS: the run's tokenizer and the tower's preprocessor config, not the tower's tokenizer"

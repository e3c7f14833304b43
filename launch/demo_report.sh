#!/usr/bin/env bash
# The paper-style table for the demo models (docs/eval.md): after launch/demo.sh, exports the dense and the γ-MoD
# instruction-tuned runs as Hugging Face dirs, makes tiny benchmark sets in every question format from the demo's
# held-out data (tests/cli/make_demo_questions.py: GQA-style jsonl, ScienceQA json, MMBench TSV, MME release
# folder, MMMU samples) and runs `gmod report` on both models into runs/demo-report (report.md, .json, .svg).
# Extra arguments go to gmod report (e.g. --force).
set -euo pipefail
cd "$(dirname "$0")/.."
for r in runs/demo-dense runs/demo-mod; do
  [ -d "$r/checkpoints" ] || { echo "demo_report: $r/checkpoints missing; run launch/demo.sh first" >&2; exit 1; }
done
launch/build.sh --target gmod >&2
PY="$(launch/setup.sh | tail -1)/bin/python"
out=runs/demo-report
mkdir -p "$out"
for r in dense mod; do
  [ -f "$out/hf-$r/config.json" ] || build/bin/gmod export --checkpoint "runs/demo-$r" --out "$out/hf-$r" | tail -1
done
rm -rf "$out/data" && mkdir -p "$out/data"
cp runs/demo-data/heldout.json "$out/data/" && cp -r runs/demo-data/images "$out/data/"
"$PY" tests/cli/make_demo_questions.py "$out/data" >/dev/null
d="$out/data"
tok=tests/fixtures/tokenizer/sp/tokenizer.model
cat > "$out/suite.json" <<JSON
{
  "out": "$out",
  "answer_args": ["--max-new-tokens", "8", "--batch", "8", "--tokenizer", "$tok"],
  "models": [
    {"name": "dense", "model": "$out/hf-dense"},
    {"name": "gamma-MoD", "model": "$out/hf-mod"}
  ],
  "benchmarks": [
    {"name": "GQA", "scorer": "gqa", "questions": "$d/questions.jsonl", "annotations": ["$d/gqa_questions.json"]},
    {"name": "SQA-IMG", "scorer": "scienceqa", "questions": "$d/sqa_test.json", "format": "science",
     "answer_args": ["--single-pred-prompt"], "annotations": ["$d/sqa"]},
    {"name": "MMBench", "scorer": "mmbench", "questions": "$d/mmbench_dev.tsv", "answer_args": ["--single-pred-prompt"],
     "annotations": ["$d/mmbench_dev.tsv"]},
    {"name": "MME", "scorer": "mme", "questions": "$d/mme", "format": "mme", "annotations": ["$d/mme"]},
    {"name": "MMMU", "scorer": "mmmu", "questions": "$d/mmmu.jsonl", "images": "$d", "format": "mmmu"}
  ]
}
JSON
build/bin/gmod report --config "$out/suite.json" "$@"

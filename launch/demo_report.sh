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
. launch/demo_benchmarks.sh
benchmarks=$(demo_benchmarks "$out" "$PY")
tok=tests/fixtures/tokenizer/sp/tokenizer.model
cat > "$out/suite.json" <<JSON
{
  "out": "$out",
  "answer_args": ["--max-new-tokens", "8", "--batch", "8", "--tokenizer", "$tok"],
  "models": [
    {"name": "dense", "model": "$out/hf-dense"},
    {"name": "gamma-MoD", "model": "$out/hf-mod"}
  ],
  "benchmarks": $benchmarks
}
JSON
build/bin/gmod report --config "$out/suite.json" "$@"

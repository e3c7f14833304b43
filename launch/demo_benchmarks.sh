#!/usr/bin/env bash
# Sourced by launch/demo_report.sh and launch/demo_methods.sh: demo_benchmarks OUT PY makes tiny benchmark sets in
# every question format from the demo's held-out data under OUT/data (tests/cli/make_demo_questions.py: GQA-style
# jsonl, ScienceQA json, MMBench TSV, MME release folder, MMMU samples) and prints the suite's "benchmarks" list.
demo_benchmarks() {
  local out="$1" py="$2" d="$1/data"
  rm -rf "$d" && mkdir -p "$d"
  cp runs/demo-data/heldout.json "$d/" && cp -r runs/demo-data/images "$d/"
  "$py" tests/cli/make_demo_questions.py "$d" >/dev/null
  cat <<JSON
[
    {"name": "GQA", "scorer": "gqa", "questions": "$d/questions.jsonl", "annotations": ["$d/gqa_questions.json"]},
    {"name": "SQA-IMG", "scorer": "scienceqa", "questions": "$d/sqa_test.json", "format": "science",
     "answer_args": ["--single-pred-prompt"], "annotations": ["$d/sqa"]},
    {"name": "MMBench", "scorer": "mmbench", "questions": "$d/mmbench_dev.tsv", "answer_args": ["--single-pred-prompt"],
     "annotations": ["$d/mmbench_dev.tsv"]},
    {"name": "MME", "scorer": "mme", "questions": "$d/mme", "format": "mme", "annotations": ["$d/mme"]},
    {"name": "MMMU", "scorer": "mmmu", "questions": "$d/mmmu.jsonl", "images": "$d", "format": "mmmu"}
  ]
JSON
}

#!/usr/bin/env bash
# Every method on one run (docs/mod.md, issue 32 item 4), on the demo model: after launch/demo.sh, `gmod report`
# trains dense, γ-MoD, A-MoD, p-MoD and PyramidDrop from the demo's pre-trained dense model (runs/demo-pre/hf) on
# the same data for the same steps (2 ranks, ZeRO-1, the demo's instruction-tuning recipe), makes FastV,
# training-free PyramidDrop and Direct γ-MoD from the dense one, answers the demo benchmarks (launch/demo_benchmarks.sh)
# and times every model at batch 1 and 8 on the held-out questions; the accuracy table and the method table go to
# runs/demo-methods/report.md. Dense and γ-MoD also train on packed rows (data.pack_to, docs/data.md). About 4
# minutes on 2 cores. Extra arguments go to gmod report (--force, --retrain).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f runs/demo-pre/hf/config.json ] || { echo "demo_methods: runs/demo-pre/hf missing; run launch/demo.sh first" >&2; exit 1; }
launch/build.sh --target gmod >&2
PY="$(launch/setup.sh | tail -1)/bin/python"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=runs/demo-methods
mkdir -p "$out"
. launch/demo_benchmarks.sh
benchmarks=$(demo_benchmarks "$out" "$PY")
tok=tests/fixtures/tokenizer/sp/tokenizer.model
epochs="${GMOD_DEMO_FT_EPOCHS:-20}"
cat > "$out/suite.json" <<JSON
{
  "out": "$out",
  "answer_args": ["--max-new-tokens", "8", "--batch", "8", "--tokenizer", "$tok"],
  "train": {"config": "configs/demo.json",
            "launcher": ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                         "--mca", "btl_vader_single_copy_mechanism", "none"],
            "args": ["--set", "model.path=runs/demo-pre/hf", "--set", "model.init=pretrained",
                     "--set", "schedule.epochs=$epochs", "--set", "eval.data=", "--set", "resume=none",
                     "--set", "checkpoint.every=1000", "--set", "metrics.log_every=1"]},
  "timing": {"questions": "$out/data/questions.jsonl", "batches": [1, 8], "max_new_tokens": 16,
             "answer_args": ["--tokenizer", "$tok"]},
  "models": [
    {"name": "dense", "train": ["--set", "mod.enabled=false"]},
    {"name": "γ-MoD", "train": ["--set", "mod.rule=keep_top:2"]},
    {"name": "A-MoD", "train": ["--set", "mod.rule=layers:1,3,5", "--set", "mod.config.router=attention"]},
    {"name": "p-MoD", "train": ["--set", "mod.rule=pmod"]},
    {"name": "PyramidDrop", "train": ["--set", "mod.rule=pdrop:2,4:0.5,0.25"]},
    {"name": "dense, packed", "train": ["--set", "mod.enabled=false", "--set", "data.pack_to=1024"]},
    {"name": "γ-MoD, packed", "train": ["--set", "mod.rule=keep_top:2", "--set", "data.pack_to=1024"]},
    {"name": "FastV (dense)", "from": "dense", "args": ["--fastv", "2:0.5"]},
    {"name": "PyramidDrop, training-free (dense)", "from": "dense", "args": ["--pdrop", "2,4:0.5,0.25"]},
    {"name": "Direct γ-MoD (dense)", "from": "dense", "convert": ["--rule", "layers:1,4,5", "--direct"]}
  ],
  "benchmarks": $benchmarks
}
JSON
build/bin/gmod report --config "$out/suite.json" "$@"

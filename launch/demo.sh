#!/usr/bin/env bash
# The main job on the embedded demo default, with 2 MPI ranks and no downloads:
#   1. dense baseline: the demo LLaVA model (configs/demo_model) trained on the generated shapes data;
#   2. γ-MoD: ARank on the first batches -> convert the low-rank layers (keep_top:2 stay dense) -> train with
#      ZeRO-1 -> stop half-way with a checkpoint -> resume from it (resume auto) -> finish -> held-out eval;
#   3. a table of held-out loss, exact-match accuracy and skip ratio, dense next to γ-MoD.
# Extra arguments are passed to both trainings as --set overrides, e.g.  launch/demo.sh schedule.epochs=4
set -euo pipefail
cd "$(dirname "$0")/.."
launch/build.sh --target gmod >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
EPOCHS="${GMOD_DEMO_EPOCHS:-16}"
sets=(--set "schedule.epochs=$EPOCHS")
for s in "$@"; do sets+=(--set "$s"); done
rm -rf runs/demo-dense runs/demo-mod
t0=$(date +%s)
echo "== dense baseline ($EPOCHS epochs, 2 ranks)"
"${MPI[@]}" build/bin/gmod train --config configs/demo.json --set mod.enabled=false --set run_dir=runs/demo-dense \
  "${sets[@]}" | grep -aE '^(step|eval|checkpoint|done|model|data:)'
steps=$(grep -c '"step"' runs/demo-dense/metrics.jsonl || true)
half=$(( $(grep '"tokens"' runs/demo-dense/metrics.jsonl | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/') / 2 ))
echo "== γ-MoD: ARank -> convert -> train to step $half, stop"
"${MPI[@]}" build/bin/gmod train --config configs/demo.json --set mod.rule=keep_top:2 --set run_dir=runs/demo-mod \
  --set schedule.exit_at_step=$half "${sets[@]}" | grep -aE '^(step|eval|checkpoint|done|model|resume|arank|layer|data:)|ARank'
echo "== γ-MoD: resume from the checkpoint and finish"
"${MPI[@]}" build/bin/gmod train --config configs/demo.json --set mod.rule=keep_top:2 --set run_dir=runs/demo-mod \
  "${sets[@]}" | grep -aE '^(step|eval|checkpoint|done|resume)'
python3 - <<'PY'
import json
def last_eval(run):
    ev = [json.loads(l) for l in open(f"runs/{run}/metrics.jsonl") if '"eval"' in l]
    return ev[-1]["eval"] if ev else {}
d, m = last_eval("demo-dense"), last_eval("demo-mod")
sk = lambda e: sum(e.get("skip_ratio", {}).values()) / max(1, len(e.get("skip_ratio", {}))) if e.get("skip_ratio") else 0.0
print("\n== held-out results")
print(f"{'':10s} {'loss':>8s} {'exact match':>12s} {'skip ratio (MoD layers)':>24s}")
for name, e in (("dense", d), ("γ-MoD", m)):
    print(f"{name:10s} {e.get('loss', float('nan')):8.4f} {e.get('exact_match', float('nan')):12.3f} {sk(e):24.3f}")
print("\nmetrics: runs/demo-dense/metrics.jsonl runs/demo-mod/metrics.jsonl; ARank: runs/demo-mod/arank.json")
print("checkpoints: runs/demo-dense/checkpoints runs/demo-mod/checkpoints")
PY
echo "demo took $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# The main job on the embedded demo default, with 2 MPI ranks and no downloads (about 3 minutes after the build):
#   1. pre-train the small demo LLaVA model (configs/demo_model) densely from random init on the generated shapes
#      data, export it as a Hugging Face dir (the "pretrained dense model");
#   2. from that model, instruction-tune (a) densely and (b) as γ-MoD: ARank on the pre-trained model -> convert
#      the low-rank layers (keep_top:2 stay dense) -> train with ZeRO-1 -> stop half-way with a checkpoint ->
#      resume from it (resume auto) -> finish -> held-out eval -> plots;
#   3. print held-out loss, exact-match accuracy and skip ratio, dense next to γ-MoD, and where everything is.
# Extra arguments are --set overrides for every training, e.g.  launch/demo.sh optimizer.lr=5e-4
set -euo pipefail
cd "$(dirname "$0")/.."
launch/build.sh --target gmod >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
EPOCHS="${GMOD_DEMO_EPOCHS:-12}"
FT_EPOCHS="${GMOD_DEMO_FT_EPOCHS:-20}"
sets=(--set "schedule.epochs=$EPOCHS")
for s in "$@"; do sets+=(--set "$s"); done
rm -rf runs/demo-pre runs/demo-dense runs/demo-mod
t0=$(date +%s)
train() { "${MPI[@]}" build/bin/gmod train --config configs/demo.json "$@" | { grep -aE "$FILTER" || true; }; }
FILTER='^(step|eval|checkpoint|done|resume|arank|model:)'
echo "== 1. dense pre-training from random init ($EPOCHS epochs, 2 ranks, ZeRO-1) -> export as a Hugging Face dir"
train --set mod.enabled=false --set run_dir=runs/demo-pre --set eval.data= "${sets[@]}"
build/bin/gmod export --checkpoint runs/demo-pre --out runs/demo-pre/hf | tail -2
FT=(--set model.path=runs/demo-pre/hf --set model.init=pretrained --set "schedule.epochs=$FT_EPOCHS")
echo "== 2a. dense instruction tuning from the pre-trained model ($FT_EPOCHS epochs)"
train --set mod.enabled=false --set run_dir=runs/demo-dense "${sets[@]}" "${FT[@]}"
steps=$(grep '"tokens"' runs/demo-dense/metrics.jsonl | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/')
half=$(( steps / 2 ))
echo "== 2b. γ-MoD: ARank on the pre-trained model -> convert (keep_top:2 dense) -> train to step $half, stop"
train --set mod.rule=keep_top:2 --set run_dir=runs/demo-mod --set schedule.exit_at_step=$half "${sets[@]}" "${FT[@]}"
echo "== 2c. γ-MoD: resume from the checkpoint (resume auto) and finish"
train --set mod.rule=keep_top:2 --set run_dir=runs/demo-mod "${sets[@]}" "${FT[@]}"
build/bin/gmod plot --metrics runs/demo-mod --out runs/demo-mod/plots | tail -1 || true
python3 - <<'PY'
import json
def lines(run):
    return [json.loads(l) for l in open(f"runs/{run}/metrics.jsonl")]
def last_eval(run):
    ev = [l["eval"] for l in lines(run) if "eval" in l]
    return ev[-1] if ev else {}
def train_skip(run):  # mean over the last 10 training steps (top-k routing)
    tr = [l for l in lines(run) if "tokens" in l][-10:]
    vals = [v for l in tr for v in l.get("skip_ratio", {}).values()]
    return sum(vals) / len(vals) if vals else 0.0
mean = lambda d: sum(d.values()) / len(d) if d else 0.0
print("\n== held-out results (eval routes by threshold p > 0.005, as at inference; training routes top-k)")
print(f"{'':8s} {'loss':>8s} {'exact match':>12s} {'eval skip':>10s} {'train skip':>11s}  (skip = mean over MoD layers)")
for name, run in (("dense", "demo-dense"), ("γ-MoD", "demo-mod")):
    e = last_eval(run)
    print(f"{name:8s} {e.get('loss', float('nan')):8.4f} {e.get('exact_match', float('nan')):12.3f} "
          f"{mean(e.get('skip_ratio', {})):10.3f} {train_skip(run):11.3f}")
print("\nmetrics: runs/demo-dense/metrics.jsonl runs/demo-mod/metrics.jsonl; ARank: runs/demo-mod/arank.json; plots: runs/demo-mod/plots")
print("checkpoints: runs/demo-pre/checkpoints runs/demo-dense/checkpoints runs/demo-mod/checkpoints; dense HF export: runs/demo-pre/hf")
PY
echo "demo took $(( $(date +%s) - t0 )) s"

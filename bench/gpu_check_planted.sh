#!/usr/bin/env bash
# Every verdict of bench/gpu_check.sh that the CPU can exercise, seen red on a planted bug (ctest gpu_check_planted).
# For each bug below, `GMOD_GPU_CHECK_PLANT=BUG GMOD_GPU_CHECK_PARTS=PART gpu_check.sh --dry-run` must exit 1, with
# PART's line in verdict.txt FAIL and summary.json saying FAIL for the planted reason (bench/check_gpu_summary.py);
# the other parts are not run. Unplanted, ctest gpu_check_dry_run requires train, zero3, decode and mfu to PASS (not
# SKIP); the gtest parts SKIP there (their CUDA cases skip on the CPU), so the gtest plants use ckptrng, whose CPU
# cases run and pass, and mod, whose cases all skip.
# Usage: bench/gpu_check_planted.sh OUTDIR [BUG...]   (default: every bug; GMOD_BUILD_DIR, GMOD_PYTHON as for
#        gpu_check.sh --dry-run). Each bug's logs: OUTDIR/BUG/gmod-gpu-check. Exit 0 when every bug was seen red.
set -uo pipefail
[[ ${1:-} == --help || ${1:-} == -h || $# -lt 1 ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
root="$(cd "$(dirname "$0")/.." && pwd)"
out=$1
shift
PY="${GMOD_PYTHON:-python3}"
# BUG PART REASON (a text the FAIL verdict must contain)
CASES="gtest_rc     ckptrng rc 1
gtest_none   ckptrng the filter NoSuchSuite.* selects none
gtest_skip   mod     skipped with CUDA available
train_resume train   did not resume from step 2
train_weights train  resumed weights differ
train_trace  train   profiler trace
zero3        zero3   largest relative difference
zero3_stage  zero3   did not use ZeRO-3
decode       decode  0 realised-of-achievable lines
mfu          mfu     0 train step lines of 4
mfu_plan     mfu     gmod plan (dense, checkpointing none)"
declare -a failed=()
n=0
while read -r bug part reason; do
  [[ $# -gt 0 && " $* " != *" $bug "* ]] && continue
  n=$((n + 1))
  d="$out/$bug" t0=$SECONDS
  rm -rf "$d" && mkdir -p "$d"
  GMOD_GPU_CHECK_PLANT=$bug GMOD_GPU_CHECK_PARTS=$part TMPDIR="$d" OUT="$d" bash "$root/bench/gpu_check.sh" --dry-run \
    >"$d/run.log" 2>&1
  rc=$?
  why=""
  [[ $rc -eq 1 ]] || why="gpu_check exited $rc, not 1 (log $d/run.log)"
  grep -qE "^$part +FAIL " "$d/gmod-gpu-check/verdict.txt" 2>/dev/null || why+="${why:+; }no '$part FAIL' line in verdict.txt"
  "$PY" "$root/bench/check_gpu_summary.py" "$d/gmod-gpu-check/summary.json" --planted "$bug" --fail "$part" \
    --reason "$reason" >"$d/check.log" 2>&1 || why+="${why:+; }$(grep -m1 '^check_gpu_summary:' "$d/check.log")"
  if [[ -z $why ]]; then
    echo "planted $bug: $part FAIL as it must ($((SECONDS - t0)) s): $(grep -E "^$part +FAIL " "$d/gmod-gpu-check/verdict.txt" | cut -c1-160)"
  else
    echo "planted $bug: NOT SEEN ($((SECONDS - t0)) s): $why"
    failed+=("$bug")
  fi
  rm -rf "$d/gmod-gpu-work"  # checkpoints and logs (these also in gmod-gpu-check/logs.tgz)
done <<<"$CASES"
if ((n == 0)); then echo "gpu_check_planted: no bug named $* (see CASES in $0)"; exit 2; fi
if ((${#failed[@]})); then echo "gpu_check_planted: ${#failed[@]} of $n planted bugs not seen red: ${failed[*]}"; exit 1; fi
echo "gpu_check_planted: all $n planted bugs seen red ($SECONDS s)"

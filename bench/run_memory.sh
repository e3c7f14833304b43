#!/usr/bin/env bash
# Runs bench_memory (measured peak vs gmod plan, ZeRO-0/1/2) at 1, 2 and 3 ranks. Usage:
#   bench/run_memory.sh [build-dir] [bench args...]     e.g. bench/run_memory.sh build --dtype bf16
# (--help prints this comment.)
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
set -euo pipefail
BUILD=${1:-build}
shift || true
BIN="$BUILD/bench/bench_memory"
[[ -x "$BIN" ]] || { echo "no $BIN: cmake --build $BUILD --target bench_memory" >&2; exit 1; }
FLAGS=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[[ $(id -u) == 0 ]] && FLAGS+=(--allow-run-as-root)
for np in ${NPS:-1 2 3}; do
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun -np "$np" "${FLAGS[@]}" "$BIN" "$@"
done

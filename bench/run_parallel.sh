#!/usr/bin/env bash
# Runs bench_parallel at 1, 2 and 4 ranks. Usage: bench/run_parallel.sh [build-dir] [bench args...]
#   e.g. bench/run_parallel.sh build --params 4000000 --steps 5        (CPU, MPI)
#        NPS="1 2 4 8" bench/run_parallel.sh build --device cuda --dtype bf16 --params 500000000
# (--help prints this comment.)
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
set -euo pipefail
BUILD=${1:-build}
shift || true
BIN="$BUILD/bench/bench_parallel"
[[ -x "$BIN" ]] || { echo "no $BIN: cmake --build $BUILD --target bench_parallel" >&2; exit 1; }
FLAGS=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[[ $(id -u) == 0 ]] && FLAGS+=(--allow-run-as-root)
for np in ${NPS:-1 2 4}; do
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpirun -np "$np" "${FLAGS[@]}" "$BIN" "$@"
done

#!/usr/bin/env bash
# Training on one node: one MPI rank per GPU (or NPROC ranks on CPU).
#   launch/run_single_node.sh CONFIG [NPROC] [-- --set key=value ...]
# NPROC defaults to the number of visible GPUs (nvidia-smi -L), else 1. With GPUs, pass
# `--set model.device=cuda` (or set it in CONFIG); each rank takes GPU local_rank % device_count.
# Environment: GMOD_BIN (default build/bin/gmod), GMOD_THREADS (CPU threads per rank; default cores/NPROC),
# GMOD_KILL_GRACE (seconds mpirun waits between its SIGTERM and SIGKILL to the ranks; default 120),
# GMOD_MPIRUN_ARGS (extra mpirun options).
set -euo pipefail
usage() { echo "usage: $0 CONFIG [NPROC] [-- --set key=value ...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
config=$1; shift
nproc=""
if [[ $# -gt 0 && $1 != "--" ]]; then nproc=$1; shift; fi
[[ $# -gt 0 && $1 == "--" ]] && shift
[[ -f $config ]] || { echo "$0: config $config not found" >&2; exit 2; }
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=${GMOD_BIN:-$root/build/bin/gmod}
[[ -x $bin ]] || { echo "$0: $bin not built (launch/build.sh --target gmod)" >&2; exit 2; }

ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
if [[ -z $nproc ]]; then nproc=$(( ngpu > 0 ? ngpu : 1 )); fi
[[ $nproc =~ ^[1-9][0-9]*$ ]] || usage
cores=$(nproc)
threads=${GMOD_THREADS:-$(( cores / nproc > 0 ? cores / nproc : 1 ))}

mpi=(mpirun -np "$nproc" --bind-to none --map-by slot
     -x OMP_NUM_THREADS="$threads" -x PATH)
[[ -n ${LD_LIBRARY_PATH:-} ]] && mpi+=(-x LD_LIBRARY_PATH)
# Running as root (containers) needs Open MPI's explicit consent.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpi+=(--allow-run-as-root)
fi
(( nproc > cores )) && mpi+=(--oversubscribe)
# Preemption: TERM/INT to this script (see the end) or SIGUSR1 to mpirun (Open MPI forwards it to every rank; gmod
# saves at the next step boundary and exits 0). SIGTERM to mpirun itself is a fallback only: Open MPI 4.1 tears its
# runtime down, SIGTERMs the ranks late and SIGKILLs them odls_base_sigkill_timeout seconds after that (default 1 s,
# too short for a save; raised here), see docs/launch.md.
mpi+=(--mca odls_base_sigkill_timeout "${GMOD_KILL_GRACE:-120}")
# Shared-memory transport without CMA (which needs ptrace rights most containers do not grant).
mpi+=(--mca btl_vader_single_copy_mechanism none)
for v in $(env | grep -oE '^(NCCL|CUDA|GMOD)_[A-Za-z0-9_]*' || true); do mpi+=(-x "$v"); done
# shellcheck disable=SC2206
[[ -n ${GMOD_MPIRUN_ARGS:-} ]] && mpi+=($GMOD_MPIRUN_ARGS)

echo "run_single_node: $nproc rank(s) on $(hostname), $ngpu GPU(s), $threads threads/rank" >&2
# shellcheck source=launch/stop_forwarding.sh
source "$root/launch/stop_forwarding.sh"
run_forwarding_stops run_single_node "${mpi[@]}" "$bin" train --config "$config" --threads "$threads" "$@"

#!/usr/bin/env bash
# Training on several nodes with Open MPI: one rank per GPU across the hosts of HOSTFILE.
#   launch/run_multi_node.sh HOSTFILE NPROC CONFIG [--set key=value ...]
# HOSTFILE: Open MPI format, one line per node, `node01 slots=8` (slots = GPUs of the node).
# No MASTER_ADDR/PORT: NCCL's unique id is broadcast over MPI. Every NCCL_*, CUDA_*, GMOD_*, PYTORCH_*, ATEN_* and
# ONEDNN_*/DNNL_* variable of this shell is forwarded to all ranks (e.g. NCCL_SOCKET_IFNAME=ib0, NCCL_IB_HCA=mlx5,
# NCCL_DEBUG=WARN; ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA choose the CPU kernels, which must be the same on every
# node for bitwise-equal runs).
# The gmod binary and CONFIG must exist at the same path on every node (shared file system).
# Environment: GMOD_BIN (default build/bin/gmod), GMOD_THREADS (CPU threads per rank, default 4),
# GMOD_KILL_GRACE (seconds between mpirun's SIGTERM and SIGKILL to the ranks; default 120),
# GMOD_MPIRUN_ARGS (extra mpirun options, e.g. "--mca btl_tcp_if_include ib0").
set -euo pipefail
usage() { echo "usage: $0 HOSTFILE NPROC CONFIG [--set key=value ...]" >&2; exit 2; }
[[ $# -ge 3 ]] || usage
hostfile=$1 nproc=$2 config=$3; shift 3
[[ -f $hostfile ]] || { echo "$0: hostfile $hostfile not found" >&2; exit 2; }
[[ -f $config ]] || { echo "$0: config $config not found" >&2; exit 2; }
[[ $nproc =~ ^[1-9][0-9]*$ ]] || usage
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=${GMOD_BIN:-$root/build/bin/gmod}
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
threads=${GMOD_THREADS:-4}

mpi=(mpirun -np "$nproc" --hostfile "$hostfile" --map-by slot --bind-to none
     -x OMP_NUM_THREADS="$threads" -x PATH)
[[ -n ${LD_LIBRARY_PATH:-} ]] && mpi+=(-x LD_LIBRARY_PATH)
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpi+=(--allow-run-as-root -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)
fi
# Preemption: TERM/INT to this script (see the end) or SIGUSR1 to mpirun (forwarded to every rank: save at the next
# step boundary, exit 0). SIGTERM to mpirun itself is a fallback: the raised kill grace (default 1 s in Open MPI)
# gives the ranks time to save (docs/launch.md).
mpi+=(--mca odls_base_sigkill_timeout "${GMOD_KILL_GRACE:-120}")
for v in $(env | grep -oE '^(NCCL|CUDA|GMOD|PYTORCH|ATEN|ONEDNN|DNNL)_[A-Za-z0-9_]*' || true); do mpi+=(-x "$v"); done
# shellcheck disable=SC2206
[[ -n ${GMOD_MPIRUN_ARGS:-} ]] && mpi+=($GMOD_MPIRUN_ARGS)

echo "run_multi_node: $nproc rank(s) over $(grep -cvE '^\s*(#|$)' "$hostfile") host(s) of $hostfile" >&2
# shellcheck source=launch/stop_forwarding.sh
source "$root/launch/stop_forwarding.sh"
run_forwarding_stops run_multi_node "${mpi[@]}" "$bin" train --config "$config" --threads "$threads" "$@"

#!/usr/bin/env bash
# Rehearse a cluster launch on one machine (docs/launch.md): bring up NODES (1-3) namespaced nodes (nodes.sh) with
# WORK_DIR as their shared file system and WORK_DIR/hostfile (node1..nodeN, slots=2 each), run COMMAND on node1 (the
# head node) from the current directory with GMOD_MPIRUN_ARGS set to the launch agent and the gmn0 interface (as a
# cluster user sets ssh and interface options), and tear everything down when it ends. Exits with COMMAND's code;
# 77 when namespaces cannot be made here (named). Run as root.
#   tests/multinode/rehearse.sh NODES WORK_DIR COMMAND...
# e.g. GMOD_THREADS=1 tests/multinode/rehearse.sh 2 /var/tmp/rehearsal launch/run_multi_node.sh
#        /var/tmp/rehearsal/hostfile 4 configs/demo.json --set schedule.max_steps=4 --set run_dir=/var/tmp/rehearsal/run
set -uo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 NODES WORK_DIR COMMAND..." >&2; exit 2; }
source "$(cd "$(dirname "$0")" && pwd)/nodes.sh"
nodes=$1 work=$2
shift 2
extra=()
[[ -n ${GMOD_BIN:-} && -f ${GMOD_BIN:-} ]] && extra+=("$(dirname "$GMOD_BIN")")
mn_up "$nodes" "$work" "$PWD" "${extra[@]}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "rehearse: on node1: GMOD_MPIRUN_ARGS=\"$GMOD_MPIRUN_ARGS\" $*" >&2
mn_exec node1 "$@"

#!/usr/bin/env bash
# Where the ranks of a 3-node job run and what they leave where (issue 31). 3 nodes x 2 ranks through
# launch/run_multi_node.sh (hostfile slots=2 each, --map-by slot): gmod train's banner line
# "ranks (rank host/local rank): 0 node1/0, 1 node1/1, 2 node2/0, ..." must name every rank's node, and the local
# ranks (MPI's shared-memory split; they pick the GPU) must be 0..slots-1 on every node. Files: the data index cache
# <data>.gmodidx is beside the data on the shared file system (docs/launch.md) with no temporary file left over, and
# no node's own /tmp holds anything of gmod's after the job (only Open MPI's session directory may be there while it
# runs): nothing node-local is needed by another node.
#   tests/multinode/test_placement.sh GMOD_BIN WORK_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
mn_init "$@"
nodes=3 slots=2
mn_up $nodes "$MN_WORK" "$(dirname "$MN_BIN")"
mn_hostfile 3x2 "node1 slots=$slots" "node2 slots=$slots" "node3 slots=$slots"
mn_config place mod.enabled=false batch.global_batch=6 schedule.max_steps=2 checkpoint.every=2
mn_train place 3x2 $((nodes * slots)) || mn_fail "the 3-node run failed"
line=$(grep -E '^ranks \(rank host/local rank\): ' "$MN_WORK/place.log") ||
  mn_fail "no 'ranks (rank host/local rank):' line in gmod train's banner"
echo "$line"
want="ranks (rank host/local rank): "
for ((r = 0; r < nodes * slots; r++)); do
  (( r > 0 )) && want+=", "
  want+="$r node$((r / slots + 1))/$((r % slots))"
done
[[ $line == "$want" ]] || mn_fail "placement: expected '$want'"
data=$MN_WORK/data/train.json
[[ -f $data.gmodidx ]] || mn_fail "no index cache $data.gmodidx beside the data on the shared file system"
left=$(ls -d "$MN_WORK"/data/*.tmp.* 2> /dev/null)
[[ -z $left ]] || mn_fail "temporary files left beside the data: $left"
# Shared paths that lie under /tmp (a checkout in /tmp) are mounted at their path over each node's tmpfs: their top
# directory is the mount's, not gmod's.
skip=()
for p in "$MN_WORK" "$(dirname "$MN_BIN")"; do
  case $p/ in /tmp/*) rel=${p#/tmp/}; skip+=(! -name "${rel%%/*}") ;; esac
done
for ((i = 1; i <= nodes; i++)); do
  own=$(mn_exec node$i find /tmp -mindepth 1 -maxdepth 1 ! -name 'ompi.*' "${skip[@]}" -printf '%f ')
  [[ -z $own ]] || mn_fail "node$i's own /tmp holds $own after the job"
done
echo "PASS: every rank's node named, local ranks 0..$((slots - 1)) on each of $nodes nodes, index cache shared," \
     "node-local /tmp clean (${SECONDS} s)"

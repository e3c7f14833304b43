#!/usr/bin/env bash
# Paths that must be on the shared file system, put on a node's own disk instead (issue 31; docs/launch.md): each
# must end the 2-node job with an error that names the path, instead of a hang or a silently wrong run.
#   data   data.train in /tmp (node-local): rank 0 writes the demo data on node1, node2's ranks cannot open it
#   run    run_dir in /tmp (node-local): node2's ranks write their optimizer shards into node2's /tmp, and rank 0,
#          writing the checkpoint's manifest, cannot find them
#   tests/multinode/test_node_local_paths.sh GMOD_BIN WORK_DIR data|run
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ $# -eq 3 ]] || { echo "usage: $0 GMOD_BIN WORK_DIR data|run" >&2; exit 2; }
what=$3
local_dir=/tmp/gmod-node-local-$$
case $what in
  data) sets=(data.train="\"$local_dir/data/train.json\"") want="$local_dir/data/train.json" ;;
  run) sets=(run_dir="\"$local_dir/run\"") want="$local_dir/run/checkpoints/step-2.tmp" ;;
  *) echo "$0: unknown case '$what' (data or run)" >&2; exit 2 ;;
esac
mn_init "$1" "$2"
mn_up 2 "$MN_WORK" "$(dirname "$MN_BIN")"
mn_hostfile 2x2 "node1 slots=2" "node2 slots=2"
timeout_s=15 grace=10
mn_config job mod.enabled=false schedule.max_steps=2 parallel.timeout_s=$timeout_s "${sets[@]}"
start=$SECONDS
GMOD_KILL_GRACE=$grace mn_train job 2x2 4 && mn_fail "$what on node-local /tmp: the 2-node job succeeded"
took=$((SECONDS - start))
grep -E 'error' "$MN_WORK/job.log" | head -5
grep -E "\[rank [0-9]\] error: .*$want" "$MN_WORK/job.log" > /dev/null ||
  mn_fail "$what on node-local /tmp: no '[rank R] error: ...' naming $want"
# The failing ranks' MPI_Abort makes Open MPI SIGTERM the others, which gmod takes for a stop request (finish the
# step, save) while they wait in a collective for the dead ranks: they go at the watchdog (timeout_s + 21 s) or at
# SIGKILL, GMOD_KILL_GRACE after the SIGTERM (per node: 2 x grace). Bound: timeout_s + 21 + 2 x grace + 30.
limit=$((timeout_s + 21 + 2 * grace + 30))
(( took <= limit )) || mn_fail "$what on node-local /tmp: the job took $took s to fail (bound $limit s)"
echo "PASS: $what on node-local /tmp ends the 2-node job in $took s with an error naming $want (${SECONDS} s)"

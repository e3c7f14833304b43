#!/usr/bin/env bash
# launch/run_multi_node.sh forwards every NCCL_*, CUDA_*, GMOD_*, PYTORCH_*, ATEN_* and ONEDNN_* variable of the launching shell to
# every rank on every node (issue 31). 2 nodes x 2 ranks through the namespace launch agent, which like ssh starts
# the remote side with a fresh environment; tests/multinode/probe_env.sh stands in for gmod and prints each rank's
# variables. A variable outside those prefixes (MN_UNFORWARDED) must reach node1's ranks only (they are mpirun's
# children), not node2's: otherwise the agent leaks the launcher's environment and this test proves nothing.
#   tests/multinode/test_forward_env.sh WORK_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ $# -eq 1 ]] || { echo "usage: $0 WORK_DIR" >&2; exit 2; }
mn_init "$here/probe_env.sh" "$1"
mn_up 2 "$MN_WORK"
mn_hostfile 2x2 "node1 slots=2" "node2 slots=2"
echo '{}' > "$MN_WORK/probe.json"
export NCCL_SOCKET_IFNAME=gmn0 NCCL_DEBUG=WARN CUDA_MN_PROBE="a b" GMOD_MN_PROBE=42 PYTORCH_MN_PROBE=x=y \
  ATEN_MN_PROBE=avx2 ONEDNN_MN_PROBE=AVX2
export MN_UNFORWARDED=1
mn_train probe 2x2 4 || mn_fail "run_multi_node.sh with the probe failed"
log=$MN_WORK/probe.log
cat "$log"
for r in 0 1 2 3; do
  node=node$((r / 2 + 1))
  line=$(grep -E "^$node rank $r:" "$log") || mn_fail "no line from rank $r on $node"
  for v in NCCL_SOCKET_IFNAME=gmn0 NCCL_DEBUG=WARN "CUDA_MN_PROBE=a b" GMOD_MN_PROBE=42 PYTORCH_MN_PROBE=x=y \
           ATEN_MN_PROBE=avx2 ONEDNN_MN_PROBE=AVX2 GMOD_THREADS=1 GMOD_BIN=; do
    [[ $line == *" $v"* || $line == *":$v"* ]] || mn_fail "rank $r on $node lacks $v: $line"
  done
  if [[ $node == node2 && $line == *MN_UNFORWARDED* ]]; then
    mn_fail "rank $r on node2 has MN_UNFORWARDED: the launch agent leaked the launcher's environment"
  fi
done
grep -q "node2: .*orted" "$GMOD_MN_STATE/agent.log" || mn_fail "mpirun did not start node2's orted through the agent"
echo "PASS: every NCCL_/CUDA_/GMOD_/PYTORCH_/ATEN_/ONEDNN_ variable reached all 4 ranks on both nodes (${SECONDS} s)"

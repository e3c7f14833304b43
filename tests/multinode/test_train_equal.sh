#!/usr/bin/env bash
# Training on 2 nodes x 2 ranks equals the single-node 4-rank run bitwise (issue 31): the same config, once on node1
# with slots=4 and once over node1 + node2 (slots=2 each), both through launch/run_multi_node.sh; the final
# checkpoints' weights (gmod export, safetensors compared byte for byte) must be equal. Between the nodes the ranks
# talk TCP over gmn0 (the bridge); the test also requires the 2-node run's traffic through node2's bridge port (at
# least the gradients: > 1 MB), so a run that did not really cross nodes fails.
#   tests/multinode/test_train_equal.sh GMOD_BIN WORK_DIR VARIANT
# VARIANT: zero1, zero2, zero3 (dense), mod (γ-MoD, arank_mod rule, ZeRO-1).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ $# -eq 3 ]] || { echo "usage: $0 GMOD_BIN WORK_DIR zero1|zero2|zero3|mod" >&2; exit 2; }
variant=$3
case $variant in
  zero1) sets=(optimizer.zero_stage=1 mod.enabled=false) ;;
  zero2) sets=(optimizer.zero_stage=2 mod.enabled=false) ;;
  zero3) sets=(optimizer.zero_stage=3 mod.enabled=false) ;;
  mod) sets=(optimizer.zero_stage=1 mod.enabled=true) ;;
  *) echo "$0: unknown VARIANT '$variant' (zero1, zero2, zero3 or mod)" >&2; exit 2 ;;
esac
mn_init "$1" "$2"
mn_up 2 "$MN_WORK" "$(dirname "$MN_BIN")"
mn_hostfile 1x4 "node1 slots=4"
mn_hostfile 2x2 "node1 slots=2" "node2 slots=2"
mn_config one "${sets[@]}"
mn_config two "${sets[@]}"
steps=6
mn_train one 1x4 4 || mn_fail "the single-node 4-rank run failed"
port=$(cat "$GMOD_MN_STATE/node2.port")
bytes() { ip netns exec "$MN_TAG-sw" cat "/sys/class/net/$port/statistics/$1_bytes"; }
before=$(( $(bytes rx) + $(bytes tx) ))
mn_train two 2x2 4 || mn_fail "the 2-node run failed"
crossed=$(( $(bytes rx) + $(bytes tx) - before ))
(( crossed > 1000000 )) || mn_fail "only $crossed bytes crossed node2's link: the ranks did not talk over the bridge"
grep -q "gmod train: 4 rank(s)" "$MN_WORK/two.log" || mn_fail "no 4-rank banner in the 2-node run's output"
mn_export one $steps
mn_export two $steps
echo "single node: $(mn_losses one)"
echo "2 nodes:     $(mn_losses two)"
mn_same_weights one-$steps.export two-$steps.export ||
  mn_fail "$variant: the final weights of 2 nodes x 2 ranks differ from 1 node x 4 ranks"
echo "PASS: $variant: 2 nodes x 2 ranks = 1 node x 4 ranks bitwise after $steps steps; $crossed bytes crossed" \
     "node2's link (${SECONDS} s)"

#!/usr/bin/env bash
# A checkpoint written across 2 nodes resumes bitwise on 1 node and on 3 nodes (issue 31). 2 nodes x 2 ranks train
# 6 steps (checkpoints at 2, 4, 6); two copies of its run directory keep only step-2 and resume (`resume: auto`) on
# node1 alone (slots=4) and over node1..node3 (slots 2, 1, 1: the same world of 4 ranks, local ranks 0,1 / 0 / 0);
# both must end with the weights of the uninterrupted 2-node run (gmod export, byte for byte), having resumed from
# step-2.
#   tests/multinode/test_resume_nodes.sh GMOD_BIN WORK_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
mn_init "$@"
mn_up 3 "$MN_WORK" "$(dirname "$MN_BIN")"
mn_hostfile 2x2 "node1 slots=2" "node2 slots=2"
mn_hostfile 1x4 "node1 slots=4"
mn_hostfile 3n "node1 slots=2" "node2 slots=1" "node3 slots=1"
steps=6
mn_config two
mn_train two 2x2 4 || mn_fail "the 2-node run failed"
mn_export two $steps
for target in 1x4 3n; do
  run=on-$target
  mn_config "$run"
  mkdir -p "$MN_WORK/$run/checkpoints"
  cp -a "$MN_WORK/two/checkpoints/step-2" "$MN_WORK/$run/checkpoints/" || mn_fail "cannot copy step-2"
  mn_train "$run" "$target" 4 || mn_fail "resuming on $target failed"
  grep -qE "resume: .*step-2\b" "$MN_WORK/$run.log" || mn_fail "$run did not resume from step-2"
  if [[ $target == 3n ]]; then
    grep -qE '^ranks \(rank host/local rank\): 0 node1/0, 1 node1/1, 2 node2/0, 3 node3/0$' "$MN_WORK/$run.log" ||
      mn_fail "3-node resume: ranks not placed 2+1+1 (banner: $(grep '^ranks (' "$MN_WORK/$run.log"))"
  fi
  mn_export "$run" $steps
  mn_same_weights two-$steps.export "$run-$steps.export" ||
    mn_fail "resumed on $target from the 2-node step-2: final weights differ from the uninterrupted 2-node run"
  echo "resumed on $target: $(mn_losses "$run")"
done
echo "2 nodes:   $(mn_losses two)"
echo "PASS: the 2-node checkpoint step-2 resumed bitwise on 1 node x 4 and on 3 nodes (2+1+1) (${SECONDS} s)"

#!/usr/bin/env bash
# A node lost mid-training, and a stop sent to the launcher (issue 31). 2 nodes x 2 ranks, 6 steps, a checkpoint
# every 2, parallel.timeout_s = T (15). Once step 3 is logged, one of:
#   kill      SIGKILL to every process of node2 (its orted and both ranks)
#   stop      SIGSTOP to every process of node2 (a frozen node)
#   linkdown  node2's link to the bridge goes down (ip link set ... down)
#   sigterm   SIGTERM to run_multi_node.sh on node1 (a scheduler's preemption)
# and killsave: SIGKILL to every process of node2 inside the save of step 4 (GMOD_FAULT_INJECT slow_save holds
# rank 2 there once its files are written, before the ranks meet to commit): as kill, and step-4 must not become a
# checkpoint; the rerun resumes from step-2.
# kill/linkdown: the job must end (launcher exits non-zero) within T + BOUND seconds (BOUND = 60) of the
# failure, its output naming node2 and its ranks 2 and 3 (gmod's watchdog); then, the node repaired, the same
# command (`resume: auto`) resumes from the last complete checkpoint and ends with the weights of the uninterrupted
# run, byte for byte. sigterm: the launcher exits 0, every rank saved the step it was at (named in the output), and
# the rerun ends with the uninterrupted run's weights. stop: gmod's ranks on node1 end within T + BOUND, but mpirun
# waits for node2's frozen orted as long as it is frozen (Open MPI has no daemon heartbeat, and a stopped process's
# kernel still answers TCP keepalives); the test requires node1 free of ranks within T + BOUND, then resets node2
# (SIGKILL to its processes, as an operator power-cycles a hung node); mpirun, already terminating the job, then
# does not end by itself (Open MPI 4.1), so after 10 s the operator sends run_multi_node.sh two SIGTERMs (the second
# reaches mpirun); should mpirun still run 30 s later (under load), SIGKILL to it. MODE reference trains the
# uninterrupted run into WORK_DIR (the other modes read it from REF_DIR).
#   tests/multinode/test_node_failure.sh GMOD_BIN WORK_DIR reference
#   tests/multinode/test_node_failure.sh GMOD_BIN WORK_DIR kill|killsave|stop|linkdown|sigterm REF_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
usage() {
  echo "usage: $0 GMOD_BIN WORK_DIR reference | GMOD_BIN WORK_DIR kill|killsave|stop|linkdown|sigterm REF_DIR" >&2
  exit 2
}
(( $# >= 3 )) || usage
mode=$3
steps=6 timeout_s=15 bound=60
case $mode in
  reference) (( $# == 3 )) || usage ;;
  kill|killsave|stop|linkdown|sigterm)
    (( $# == 4 )) || usage
    ref=$4/ref-$steps.export ;;
  *) usage ;;
esac
mn_init "$1" "$2"
# Nodes first: where namespaces cannot be made this exits 77 (skipped), as the reference run did, instead of
# failing for want of the reference that run could not make.
mn_up 2 "$MN_WORK" "$(dirname "$MN_BIN")"
if [[ -n ${ref:-} ]]; then
  [[ -d $ref ]] || mn_fail "no reference export $ref (run MODE reference into $4 first)"
  ref=$(cd "$ref" && pwd)
fi
mn_hostfile 2x2 "node1 slots=2" "node2 slots=2"
if [[ $mode == reference ]]; then
  mn_config ref parallel.timeout_s=$timeout_s
  mn_train ref 2x2 4 || mn_fail "the uninterrupted 2-node run failed"
  mn_export ref $steps
  echo "PASS: reference: $(mn_losses ref) (${SECONDS} s)"
  exit 0
fi

mn_config job parallel.timeout_s=$timeout_s
trigger="step 3/$steps "
if [[ $mode == killsave ]]; then
  # Rank 2 (node2) prints this once its files of step 4 are written; it then waits before the ranks meet to commit.
  trigger="the save of step 4 on rank 2 waits"
  GMOD_FAULT_INJECT="slow_save:rank=2,seconds=300,step=4" mn_train job 2x2 4 &
else
  mn_train job 2x2 4 &
fi
job=$!
for ((w = 0; w < 6000; w++)); do
  grep -q "$trigger" "$MN_WORK/job.log" 2> /dev/null && break
  kill -0 $job 2> /dev/null || break
  sleep 0.05
done
grep -q "$trigger" "$MN_WORK/job.log" || { wait $job; mn_fail "the job never logged '$trigger'"; }
if [[ $mode == killsave ]]; then
  ckpts=$MN_WORK/job/checkpoints
  [[ -d $ckpts/step-4.tmp && ! -e $ckpts/step-4 ]] ||
    mn_fail "killsave: the save of step 4 is not in progress (checkpoints: $(ls "$ckpts" | tr '\n' ' '))"
  echo "killsave: inside the save of step 4: step-4.tmp holds $(ls "$ckpts/step-4.tmp" | tr '\n' ' ')"
fi
launcher_pid() {
  local p
  for p in $(mn_pids node1); do
    [[ $(tr '\0' ' ' < /proc/$p/cmdline 2> /dev/null) == *launch/run_multi_node.sh* ]] && { echo $p; return; }
  done
  mn_fail "no run_multi_node.sh process on node1"
}
mark=$(wc -l < "$MN_WORK/job.log")
t0=$EPOCHREALTIME
node2=$(mn_pids node2 | tr '\n' ' ')
case $mode in
  kill|killsave) kill -KILL $node2 ;;
  stop) kill -STOP $node2 ;;
  linkdown) ip -n "$MN_TAG-sw" link set "$(cat "$GMOD_MN_STATE/node2.port")" down ;;
  sigterm)
    launcher=$(launcher_pid)
    kill -TERM "$launcher" ;;
esac
echo "$mode at $(date +%T) (node2's processes: $node2)"
limit=$((timeout_s + bound))
node1_ranks() { for p in $(mn_pids node1); do [[ $(cat /proc/$p/comm 2> /dev/null) == gmod ]] && echo $p; done; }
for ((w = 0; w < limit * 10; w++)); do
  kill -0 $job 2> /dev/null || break
  [[ $mode == stop && -z $(node1_ranks) ]] && break
  sleep 0.1
done
thawed=""
if kill -0 $job 2> /dev/null && [[ $mode == stop ]]; then
  # Open MPI cannot tell a frozen daemon from a busy one (its kernel still answers TCP keepalives): mpirun waits for
  # node2's orted to confirm the kill. What must hold: the healthy node's ranks end in time, naming node2's ranks.
  [[ -z $(node1_ranks) ]] || mn_fail "stop: gmod ranks $(node1_ranks) still run on node1 $limit s after node2 froze"
  gone=$(python3 -c "print('%.1f' % ($EPOCHREALTIME - $t0))")
  thawed=" (node1's ranks ended after $gone s; mpirun waited for node2's frozen orted until node2 was reset)"
  echo "stop: node1's ranks ended $gone s after the freeze; mpirun waits for node2's frozen orted: node2 is reset" \
       "(SIGKILL to its processes, as a power cycle)"
  kill -KILL $node2 2> /dev/null
  for ((w = 0; w < 100; w++)); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
  if kill -0 $job 2> /dev/null; then
    # Open MPI 4.1's mpirun, already terminating the job when the daemon's loss comes, does not end by itself: the
    # operator stops the launcher (two SIGTERMs: the second reaches mpirun).
    launcher=$(launcher_pid)
    thawed+="; mpirun still waited 10 s after the reset: 2 x SIGTERM to run_multi_node.sh"
    kill -TERM "$launcher"; sleep 1; kill -TERM "$launcher"
    for ((w = 0; w < 300; w++)); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    if kill -0 $job 2> /dev/null; then
      # Under load mpirun may still be tearing down the job 30 s later (seen once in a full ctest run): the operator's
      # last resort, SIGKILL to mpirun. gmod's part (node1's ranks ended, naming node2's) was checked above.
      for p in $(mn_pids node1); do [[ $(cat /proc/$p/comm 2> /dev/null) == mpirun ]] && kill -KILL "$p"; done
      thawed+="; mpirun still ran 30 s after the SIGTERMs: SIGKILL to mpirun"
      for ((w = 0; w < 100; w++)); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    fi
  fi
fi
if kill -0 $job 2> /dev/null; then
  mn_down
  mn_fail "$mode: the job was still running $limit s (parallel.timeout_s + $bound) after the failure$thawed"
fi
wait $job
rc=$?
took=$(python3 -c "print('%.1f' % ($EPOCHREALTIME - $t0))")
after=$(tail -n +"$((mark + 1))" "$MN_WORK/job.log")
echo "$mode: the launcher exited with code $rc $took s after it; what the job printed since:"
echo "$after" | grep -vE '^step [0-9]' | head -30
if [[ $mode == sigterm ]]; then
  (( rc == 0 )) || mn_fail "sigterm: run_multi_node.sh exited $rc, not 0"
  saved=$(echo "$after" | grep -oE 'checkpoint: [^ ]*step-[0-9]+' | tail -1)
  [[ -n $saved ]] || mn_fail "sigterm: no checkpoint saved after the signal"
  echo "$after" | grep -q "stopped by signal at step" || mn_fail "sigterm: no 'stopped by signal' line"
else
  (( rc != 0 )) || mn_fail "$mode: the launcher exited 0 although node2 was lost"
  echo "$after" | grep -q node2 || mn_fail "$mode: the output after the failure does not name node2"
  if echo "$after" | grep -qE 'rank 2\b' && echo "$after" | grep -qE 'rank 3\b'; then
    echo "$mode: gmod named node2's ranks 2 and 3"
  elif [[ $mode == kill* ]] && grep -qE '^ranks \(rank host/local rank\): .*2 node2/0, 3 node2/1' "$MN_WORK/job.log"; then
    # A killed node's orted is missed by mpirun within a second; it may tear the job down before gmod's ranks on
    # node1 report anything (seen under load in the full ctest run). The job's banner then says which ranks node2
    # ran, and mpirun's message names node2 (checked above).
    echo "$mode: mpirun ended the job before gmod's ranks reported; the banner maps node2 to ranks 2 and 3"
  else
    mn_fail "$mode: the output after the failure does not name node2's ranks 2 and 3"
  fi
  # The node comes back: its leftovers killed, its link up.
  for p in $(mn_pids node2); do kill -CONT "$p"; kill -KILL "$p"; done 2> /dev/null
  port=$(cat "$GMOD_MN_STATE/node2.port")
  ip -n "$MN_TAG-sw" link set "$port" up
  # Back up and forwarding before the rerun: a rerun started at once had node2's orted fail to reach mpirun
  # ("an inability to create a connection back to mpirun", once in a full ctest run).
  for ((w = 0; w < 100; w++)); do
    [[ $(ip -n "$MN_TAG-sw" -o link show "$port") == *LOWER_UP* &&
       $(mn_exec node2 ip -o link show gmn0) == *LOWER_UP* ]] && break
    sleep 0.1
  done
  sleep 2  # neighbour entries that went stale while the link was down
  for p in $(mn_pids node1); do kill -KILL "$p"; done 2> /dev/null
fi
newest=$(cd "$MN_WORK/job/checkpoints" && ls -d step-* 2> /dev/null | grep -v '\.tmp$' | sort -t- -k2 -n | tail -1)
[[ -n $newest ]] || mn_fail "$mode: no complete checkpoint left"
if [[ $mode == killsave ]]; then
  [[ $newest == step-2 ]] || mn_fail "killsave: the newest complete checkpoint is $newest, not step-2 (the save of" \
    "step 4 was cut by the kill)"
fi
mark=$(wc -l < "$MN_WORK/job.log")
mn_train job 2x2 4 || mn_fail "$mode: the rerun (resume: auto) failed"
tail -n +"$((mark + 1))" "$MN_WORK/job.log" | grep -qE "resume: .*$newest\b" ||
  mn_fail "$mode: the rerun did not resume from $newest"
mn_export job $steps
cp -a "$ref" "$MN_WORK/ref.export" || mn_fail "cannot copy the reference export $ref"
mn_same_weights job-$steps.export ref.export ||
  mn_fail "$mode: resumed from $newest, the final weights differ from the uninterrupted run"
echo "PASS: $mode: ended ${took} s after it$thawed (rc $rc), resumed from $newest, final weights equal the uninterrupted" \
     "run (${SECONDS} s)"

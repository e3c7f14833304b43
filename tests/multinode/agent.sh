#!/usr/bin/env bash
# Open MPI's rsh launch agent for the nodes of tests/multinode/nodes.sh, used in place of ssh
# (`--mca plm_rsh_agent tests/multinode/agent.sh`): called as `agent.sh [ssh options] HOST COMMAND...`, it runs
# COMMAND with /bin/sh -c (as sshd would, words joined by spaces) inside HOST's network, mount and UTS namespaces.
# Like sshd, it starts COMMAND with a fresh environment (PATH, LD_LIBRARY_PATH, HOME, USER, LOGNAME, SHELL and
# GMOD_MN_STATE, which names the running nodes, so that orteds can start orteds: Open MPI's tree spawn), not the
# launching shell's: what a remote rank sees is what mpirun forwards (-x). Each call is logged to
# $GMOD_MN_STATE/agent.log.
set -uo pipefail
[[ -n ${GMOD_MN_STATE:-} && -d ${GMOD_MN_STATE:-} ]] || { echo "agent.sh: GMOD_MN_STATE is not a running node set" >&2; exit 255; }
while [[ $# -gt 0 && $1 == -* ]]; do  # ssh options (-x, -o X, -p N, ...) mean nothing here
  case $1 in -o|-p|-l|-i|-F) shift 2 ;; *) shift ;; esac
done
[[ $# -ge 2 ]] || { echo "agent.sh: usage: agent.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift
[[ -f $GMOD_MN_STATE/$host.pid ]] || { echo "agent.sh: no node '$host' (nodes: $(cd "$GMOD_MN_STATE" && ls *.pid 2>/dev/null | sed 's/\.pid$//' | tr '\n' ' '))" >&2; exit 255; }
echo "$(date +%T.%N) $host: $*" >> "$GMOD_MN_STATE/agent.log"
keep=(PATH="$PATH" HOME="${HOME:-/}" USER="${USER:-$(id -un)}" LOGNAME="${LOGNAME:-$(id -un)}" SHELL=/bin/sh
      GMOD_MN_STATE="$GMOD_MN_STATE")
[[ -n ${LD_LIBRARY_PATH:-} ]] && keep+=(LD_LIBRARY_PATH="$LD_LIBRARY_PATH")
cd / || exit 255
# Like an ssh client, this process stays on the calling node while COMMAND runs on HOST: losing HOST's processes
# does not kill it; it then exits 255 (ssh's code for a lost connection). A signal to it ends COMMAND too.
nsenter -t "$(cat "$GMOD_MN_STATE/$host.pid")" -n -m -u -- env -i "${keep[@]}" /bin/sh -c "$*" &
remote=$!
trap 'kill -TERM $remote 2> /dev/null' TERM INT HUP
while :; do
  wait $remote 2> /dev/null
  status=$?
  kill -0 $remote 2> /dev/null || break
done
(( status > 128 )) && exit 255
exit "$status"

#!/usr/bin/env bash
# Open MPI's rsh launch agent for the nodes of tests/multinode/nodes.sh, used in place of ssh
# (`--mca plm_rsh_agent tests/multinode/agent.sh`): called as `agent.sh [ssh options] HOST COMMAND...`, it runs
# COMMAND with /bin/sh -c (as sshd would, words joined by spaces) inside HOST's network, mount and UTS namespaces.
# GMOD_MN_STATE (exported by mn_up) names the running nodes. Each call is logged to $GMOD_MN_STATE/agent.log.
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
exec nsenter -t "$(cat "$GMOD_MN_STATE/$host.pid")" -n -m -u -- /bin/sh -c "$*"

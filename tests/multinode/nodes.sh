# shellcheck shell=bash
# Sourced: "nodes" on one Linux machine for rehearsing a multi-node launch (issue 31).
#   mn_up N WORK [SHARED...]  N (1-3) nodes node1..nodeN, each its own network namespace (loopback + one interface
#                     gmn0, 10.231.0.(10+i)/24, on a bridge that lives in a namespace of its own), its own hostname
#                     (UTS namespace) and its own /tmp (a tmpfs in its own mount namespace); /etc/hosts names the
#                     nodes. Everything else is the shared file system, the same path on every node (like a
#                     cluster's NFS/Lustre): WORK (the run directories), the repository, the binary. WORK and each
#                     SHARED path that lies under /tmp is mounted again at its path over the node's own /tmp.
#                     Writes WORK/hostfile (slots=2 each).
#   mn_exec NODE CMD...   run CMD on NODE (its namespaces); the launch agent (agent.sh) does the same for mpirun.
#   mn_pids NODE          the processes of NODE's job (orted, ranks, launcher), without the namespace holder
#   mn_down               kill every process of the nodes, delete the namespaces (also on exit: trap in mn_up)
# Exports GMOD_MN_STATE (read by agent.sh) and GMOD_MPIRUN_ARGS: the agent and the MCA settings that keep Open MPI
# on gmn0 (out-of-band and TCP BTL); between nodes the ranks talk TCP (each node has its own /tmp, so Open MPI's
# shared-memory segments of one node are invisible to another, and Open MPI only uses vader between ranks it
# places on one node). Nothing binds or sends outside these namespaces: the bridge is not in the host's stack.
# Missing rights or tools: mn_up exits 77 (ctest's skip code) naming what is missing.

mn_skip() { echo "multinode: SKIP: $*" >&2; exit 77; }

mn_check_tools() {
  [[ $(id -u) -eq 0 ]] || mn_skip "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  local t
  for t in ip unshare nsenter mpirun setsid mount; do
    command -v "$t" > /dev/null 2>&1 || mn_skip "no '$t' on PATH"
  done
}

# mn_up N WORK
mn_up() {
  local n=$1 work=$2 i
  [[ $n =~ ^[1-3]$ ]] || { echo "mn_up: N must be 1, 2 or 3, not '$n'" >&2; exit 2; }
  mn_check_tools
  mkdir -p "$work" || { echo "mn_up: cannot create $work" >&2; exit 2; }
  work=$(cd "$work" && pwd)
  local shared=() p
  for p in "$work" "$(mn_here)/../.." "${@:3}"; do
    p=$(cd "$p" 2> /dev/null && pwd) || { echo "mn_up: shared path '$p' is not a directory" >&2; exit 2; }
    case $p/ in /tmp/*) shared+=("$p") ;; esac
  done
  # The folders of the shared libraries the gmod binary loads (LibTorch in the torch venv) are shared the same way
  # when they lie under /tmp (GMOD_CACHE=/tmp/...): the node's own /tmp would hide them (libtorch.so not found).
  if [[ -n ${MN_BIN:-} ]]; then
    while read -r p; do
      p=$(dirname "$p")
      case $p/ in /tmp/*) [[ " ${shared[*]} " == *" $p "* ]] || shared+=("$p") ;; esac
    done < <(ldd "$MN_BIN" 2> /dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
  fi
  mn_reap
  # shellcheck disable=SC2034  # read by the sourcing script
  MN_WORK=$work
  MN_TAG=gmn$$
  GMOD_MN_STATE=$work/.nodes
  export GMOD_MN_STATE
  rm -rf "$GMOD_MN_STATE"
  mkdir -p "$GMOD_MN_STATE"
  trap 'mn_down' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  # The switch: a namespace holding only the bridge.
  ip netns add "$MN_TAG-sw" 2> "$GMOD_MN_STATE/err" || mn_skip "ip netns add failed: $(cat "$GMOD_MN_STATE/err")"
  echo "$MN_TAG-sw" >> "$GMOD_MN_STATE/netns"
  ip -n "$MN_TAG-sw" link add br0 type bridge || mn_skip "cannot create a bridge (no bridge support in the kernel?)"
  ip -n "$MN_TAG-sw" link set br0 up
  : > "$GMOD_MN_STATE/hosts"
  printf '127.0.0.1 localhost\n' >> "$GMOD_MN_STATE/hosts"
  for ((i = 1; i <= n; i++)); do printf '10.231.0.%d node%d\n' $((10 + i)) "$i" >> "$GMOD_MN_STATE/hosts"; done
  : > "$work/hostfile"
  for ((i = 1; i <= n; i++)); do
    local node=node$i ns=$MN_TAG-n$i
    ip netns add "$ns" || mn_skip "ip netns add $ns failed"
    echo "$ns" >> "$GMOD_MN_STATE/netns"
    ip link add "$MN_TAG-$i" netns "$MN_TAG-sw" type veth peer name gmn0 netns "$ns" ||
      mn_skip "cannot create a veth pair"
    ip -n "$MN_TAG-sw" link set "$MN_TAG-$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.231.0.$((10 + i))/24" dev gmn0
    ip -n "$ns" link set gmn0 up
    echo "$MN_TAG-$i" > "$GMOD_MN_STATE/$node.port"
    echo "$ns" > "$GMOD_MN_STATE/$node.netns"
    # The holder: the node's mount and UTS namespaces live as long as it does; agent.sh enters them by its pid.
    # Shared paths under /tmp are opened before the node's tmpfs covers them and bound back from those descriptors.
    setsid ip netns exec "$ns" unshare --mount --uts --propagation private bash -c '
      set -e
      hostname "$1"
      mount --bind "$2" /etc/hosts
      fds=()
      for p in "${@:4}"; do exec {fd}< "$p"; fds+=("$fd"); done
      mount -t tmpfs -o size=512m,mode=1777 "$1-tmp" /tmp
      for i in "${!fds[@]}"; do
        p=${*:4+i:1}
        mkdir -p "$p"
        mount --no-canonicalize --bind "/proc/self/fd/${fds[i]}" "$p"
        exec {fds[i]}<&-
      done
      echo ready > "$3.ready"
      exec sleep 100000000' mn-holder "$node" "$GMOD_MN_STATE/hosts" "$GMOD_MN_STATE/$node" "${shared[@]}" \
      < /dev/null > "$GMOD_MN_STATE/$node.holder.log" 2>&1 &
    echo $! > "$GMOD_MN_STATE/$node.pid"
    disown $!
    echo "$node slots=2" >> "$work/hostfile"
  done
  local w
  for ((i = 1; i <= n; i++)); do
    for ((w = 0; w < 100; w++)); do [[ -f $GMOD_MN_STATE/node$i.ready ]] && break; sleep 0.05; done
    [[ -f $GMOD_MN_STATE/node$i.ready ]] ||
      mn_skip "node$i's mount/UTS namespace could not be made: $(cat "$GMOD_MN_STATE/node$i.holder.log")"
  done
  for ((i = 1; i <= n; i++)); do
    [[ $(ip -n "$MN_TAG-n$i" -br link show gmn0) == *UP* ]] || mn_skip "node$i's link gmn0 did not come up"
  done
  GMOD_MPIRUN_ARGS="--mca plm_rsh_agent $(mn_here)/agent.sh --mca oob_tcp_if_include gmn0"
  GMOD_MPIRUN_ARGS+=" --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3"
  GMOD_MPIRUN_ARGS+=" --mca btl_tcp_if_include gmn0 --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none"
  export GMOD_MPIRUN_ARGS
  echo "multinode: $n node(s) up (namespaces $MN_TAG-*): $(tr '\n' ' ' < "$work/hostfile")" >&2
}

# Namespaces left by a harness that was killed before its trap ran (e.g. a ctest timeout's SIGKILL): gmnPID-*
# whose PID is gone. Their processes are killed and the namespaces deleted.
mn_reap() {
  local ns pid p
  for ns in $(ip netns list 2> /dev/null | grep -oE '^gmn[0-9]+-(sw|n[0-9]+)'); do
    pid=${ns#gmn}
    pid=${pid%%-*}
    kill -0 "$pid" 2> /dev/null && continue
    for p in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
    ip netns del "$ns" 2> /dev/null && echo "multinode: removed $ns, left by a harness that is gone" >&2
  done
}

mn_here() { (cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); }

mn_holder() { cat "$GMOD_MN_STATE/$1.pid" 2> /dev/null || { echo "mn: no node $1" >&2; return 2; }; }

# mn_exec NODE CMD...: the working directory is kept (it is on the shared file system).
mn_exec() {
  local pid
  pid=$(mn_holder "$1") || return 2
  shift
  nsenter -t "$pid" -n -m -u --wd="$PWD" -- "$@"
}

# The processes in NODE's network namespace, except its holder.
mn_pids() {
  local ns holder p
  ns=$(cat "$GMOD_MN_STATE/$1.netns") || return 2
  holder=" $(mn_holder "$1") "
  for p in $(ip netns pids "$ns"); do [[ $holder == *" $p "* ]] || echo "$p"; done
}

mn_down() {
  [[ -n ${GMOD_MN_STATE:-} && -d $GMOD_MN_STATE ]] || return 0
  local ns p
  if [[ -f $GMOD_MN_STATE/netns ]]; then
    while read -r ns; do
      for p in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
    done < "$GMOD_MN_STATE/netns"
  fi
  for p in "$GMOD_MN_STATE"/node*.pid; do [[ -f $p ]] && kill -KILL "$(cat "$p")" 2> /dev/null; done
  sleep 0.2
  if [[ -f $GMOD_MN_STATE/netns ]]; then
    while read -r ns; do ip netns del "$ns" 2> /dev/null; done < "$GMOD_MN_STATE/netns"
  fi
  rm -rf "$GMOD_MN_STATE"
  GMOD_MN_STATE=""
}

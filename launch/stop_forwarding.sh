# Sourced by run_single_node.sh and run_multi_node.sh: runs mpirun so that a stop reaches the ranks as a save.
#   run_forwarding_stops LAUNCHER_NAME MPIRUN_COMMAND...   (exits with mpirun's status)
# TERM or INT to the launcher (Ctrl-C, kill, timeout, a scheduler) becomes SIGUSR1 to mpirun, which forwards it to
# every rank: they finish the step, save a checkpoint and exit 0, and so does the launcher. mpirun runs in a session
# of its own (setsid), so that a TERM/INT meant for the job's process group (Ctrl-C, `timeout`) does not reach it
# directly: Open MPI would tear the job down instead (docs/launch.md). A second TERM/INT passes TERM on to mpirun
# (stop now, no save).
run_forwarding_stops() {
  launcher=$1
  shift
  job=""
  stops=0
  on_stop() {
    stops=$((stops + 1))
    [[ -n $job ]] || return 0  # not started yet: forwarded right after the start
    if (( stops == 1 )); then
      echo "$launcher: $1 -> SIGUSR1 to the ranks: save and stop (again to stop without saving)" >&2
      kill -USR1 "$job" 2>/dev/null || true
    else
      echo "$launcher: $1 again -> SIGTERM to mpirun" >&2
      kill -TERM "$job" 2>/dev/null || true
    fi
  }
  trap 'on_stop SIGTERM' TERM
  trap 'on_stop SIGINT' INT
  local setsid=()
  command -v setsid >/dev/null 2>&1 && setsid=(setsid)
  "${setsid[@]}" "$@" &
  job=$!
  if (( stops > 0 )); then stops=0; on_stop "an early signal"; fi
  # `wait` returns early when a trapped signal arrives; wait again until mpirun has really finished.
  local status
  while :; do
    wait "$job" && status=0 || status=$?
    kill -0 "$job" 2>/dev/null || break
  done
  exit "$status"
}

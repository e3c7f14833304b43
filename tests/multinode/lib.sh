# shellcheck shell=bash
# Sourced by the tests of tests/multinode: the gmod runs they make, on the nodes of nodes.sh, through
# launch/run_multi_node.sh exactly as a user launches it (the launch agent and MCA settings in GMOD_MPIRUN_ARGS).
#   mn_init GMOD_BIN WORK        check the binary, make WORK (shared file system of the nodes) afresh
#   mn_config NAME [KEY=VALUE...]  WORK/NAME.json: the demo model, 40 demo records, 6 steps, a checkpoint every 2
#   mn_hostfile NAME LINE...     WORK/NAME.hosts, one LINE ("node1 slots=2") per node
#   mn_train NAME HOSTS NP [ARG...]  run_multi_node.sh WORK/HOSTS.hosts NP WORK/NAME.json ARG... on node1 (the head
#                                node), appending to WORK/NAME.log; returns its exit code
#   mn_export NAME STEP          gmod export of WORK/NAME's checkpoint step-STEP to WORK/NAME-STEP.export
#   mn_same_weights A B          the safetensors files of two exports are byte for byte equal
#   mn_fail MSG                  print MSG (and where the logs are) and exit 1
# shellcheck source=tests/multinode/nodes.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/nodes.sh"

MN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

mn_init() {
  [[ $# -eq 2 ]] || { echo "usage: $0 GMOD_BIN WORK_DIR" >&2; exit 2; }
  MN_BIN=$1
  [[ -x $MN_BIN && -f $MN_BIN ]] || { echo "$0: GMOD_BIN '$MN_BIN' is not an executable file" >&2; exit 2; }
  MN_BIN=$(cd "$(dirname "$MN_BIN")" && pwd)/$(basename "$MN_BIN")
  rm -rf "$2"
  mkdir -p "$2" || { echo "$0: cannot create WORK_DIR '$2'" >&2; exit 2; }
  MN_WORK=$(cd "$2" && pwd)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  SECONDS=0
}

mn_fail() {
  echo "FAIL: $*" >&2
  echo "(logs in $MN_WORK; tail of the newest:)" >&2
  local newest
  newest=$(ls -t "$MN_WORK"/*.log 2> /dev/null | head -1)
  [[ -n $newest ]] && tail -25 "$newest" >&2
  exit 1
}

# mn_config NAME [KEY=VALUE...]: KEY a dotted path of the JSON (optimizer.zero_stage=2), VALUE JSON (2, true, "x").
mn_config() {
  local name=$1
  shift
  python3 - "$MN_WORK/$name.json" "$MN_ROOT" "$MN_WORK" "$MN_WORK/$name" "$@" << 'PY'
import json, sys
out, root, work, run_dir = sys.argv[1:5]
c = {"model": {"path": root + "/configs/demo_model", "init": "random", "init_seed": 3},
     "data": {"train": work + "/data/train.json", "tokenizer": root + "/tests/fixtures/tokenizer/sp/tokenizer.model",
              "max_len": 128, "workers": 1, "demo_records": 40},
     "optimizer": {"lr": 2e-3, "warmup_steps": 2, "min_lr": 1e-4, "zero_stage": 1},
     "batch": {"micro_batch": 1, "global_batch": 4}, "schedule": {"max_steps": 6},
     "mod": {"enabled": True, "rule": "arank_mod"},
     "checkpoint": {"every": 2, "keep_last": 3}, "metrics": {"log_every": 1},
     "parallel": {"timeout_s": 30}, "seed": 11, "deterministic": True, "run_dir": run_dir, "resume": "auto"}
for kv in sys.argv[5:]:
    key, _, value = kv.partition("=")
    if not _:
        sys.exit("mn_config: '%s' is not KEY=VALUE" % kv)
    d = c
    *path, last = key.split(".")
    for p in path:
        d = d.setdefault(p, {})
    try:
        d[last] = json.loads(value)
    except ValueError:
        sys.exit("mn_config: value of %s is not JSON: %s" % (key, value))
json.dump(c, open(out, "w"), indent=1)
PY
}

mn_hostfile() {
  local name=$1
  shift
  printf '%s\n' "$@" > "$MN_WORK/$name.hosts"
}

mn_train() {
  local name=$1 hosts=$2 np=$3
  shift 3
  (cd "$MN_WORK" && mn_exec node1 env GMOD_BIN="$MN_BIN" GMOD_THREADS=1 GMOD_KILL_GRACE="${GMOD_KILL_GRACE:-30}" \
     "$MN_ROOT/launch/run_multi_node.sh" "$MN_WORK/$hosts.hosts" "$np" "$MN_WORK/$name.json" "$@" \
     >> "$MN_WORK/$name.log" 2>&1)
}

mn_export() {
  (cd "$MN_WORK" && mn_exec node1 "$MN_BIN" export --checkpoint "$MN_WORK/$1/checkpoints/step-$2" \
     --out "$MN_WORK/$1-$2.export" >> "$MN_WORK/$1.export.log" 2>&1) ||
    mn_fail "gmod export of $1 step $2 failed (see $MN_WORK/$1.export.log)"
}

mn_same_weights() {
  local f n=0
  for f in "$MN_WORK/$1"/*.safetensors; do
    [[ -f $f ]] || continue
    n=$((n + 1))
    cmp -s "$f" "$MN_WORK/$2/$(basename "$f")" || return 1
  done
  (( n > 0 ))
}

# The final loss lines ("step N/M  loss X ...") of a log, for the report.
mn_losses() { grep -oE 'step [0-9]+/[0-9]+  loss [0-9.]+' "$MN_WORK/$1.log" | tr '\n' ';'; }

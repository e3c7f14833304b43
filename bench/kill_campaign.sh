#!/usr/bin/env bash
# kill -9 of a whole `gmod train` job at random moments of its checkpoint saves, TRIALS times (default 10), on NP
# ranks (default 2) of the CPU demo model with checkpoint.every = 1. One trial: start the job, wait until the save
# of a random step (2..STEPS-1) is under way (its step-N.tmp directory exists), sleep a random 0..D ms (D = the
# median save time of the uninterrupted run, at most 20 ms, so that many kills land inside a save), SIGKILL mpirun and every rank at once; then rerun the same command (`resume: auto` must find a valid checkpoint and say
# which), let it finish, and compare the final weights with an uninterrupted run's (gmod export of both, cmp of the
# safetensors files). Prints one line per trial (where the kill landed: inside the save of step N when step-N.tmp
# was left behind) and a summary; exits 1 when any trial failed.
# With GMOD_KILL_ASYNC=1 the killed runs save with checkpoint.async = true (the reference stays synchronous): step-N.tmp
# then appears when the background write starts and lives until rank 0 commits at a later step, D is the median
# background write of an uninterrupted async run, and each trial says whether its kill landed inside the background
# write (some rank's optim-rank-<r>.h5.sum not yet written) or after it, before the commit.
# Usage: bench/kill_campaign.sh [TRIALS] [NP]         (after launch/build.sh --target gmod; GMOD_BIN overrides the binary)
# Environment: GMOD_KILL_STEPS (default 8), GMOD_KILL_MAX_DELAY_MS (default D), GMOD_KILL_SEED (default: random),
# GMOD_KILL_ASYNC (default 0).
# (--help prints this comment.)
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=${GMOD_BIN:-$root/build/bin/gmod}
trials=${1:-10}
np=${2:-2}
steps=${GMOD_KILL_STEPS:-8}
async=false
[[ ${GMOD_KILL_ASYNC:-0} == 1 ]] && async=true
RANDOM=${GMOD_KILL_SEED:-$$}
[[ -x $bin ]] || { echo "$0: $bin not built (launch/build.sh --target gmod)" >&2; exit 2; }
(( steps >= 3 )) || { echo "$0: GMOD_KILL_STEPS must be >= 3" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gmod-kill-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
mpi=(mpirun -np "$np" --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpi+=(--allow-run-as-root)
fi

# config RUN_DIR [ASYNC] -> writes RUN_DIR.json (ASYNC: checkpoint.async, default false)
config() {
  cat > "$1.json" <<JSON
{"model": {"path": "$root/configs/demo_model", "init": "random", "init_seed": 3},
 "data": {"train": "$work/data/train.json", "tokenizer": "$root/tests/fixtures/tokenizer/sp/tokenizer.model",
          "max_len": 128, "workers": 1, "demo_records": 40},
 "optimizer": {"lr": 2e-3, "warmup_steps": 2, "min_lr": 1e-4, "zero_stage": 1},
 "batch": {"micro_batch": 1, "global_batch": 4}, "schedule": {"max_steps": $steps},
 "mod": {"enabled": true, "rule": "arank_mod"},
 "checkpoint": {"every": 1, "keep_last": 2, "async": ${2:-false}}, "parallel": {"timeout_s": 60}, "seed": 11, "deterministic": true,
 "run_dir": "$1", "resume": "auto"}
JSON
}
train() { "${mpi[@]}" "$bin" train --threads 1 --config "$1.json" >> "$1.log" 2>&1; }
export_weights() { "$bin" export --checkpoint "$1/checkpoints/step-$steps" --out "$2" > /dev/null 2>&1; }
same_weights() {
  local f ok=1
  for f in "$1"/*.safetensors; do cmp -s "$f" "$2/$(basename "$f")" || ok=0; done
  ls "$1"/*.safetensors > /dev/null 2>&1 || ok=0
  (( ok ))
}

ref="$work/ref"
config "$ref"
train "$ref" || { echo "reference run failed:"; tail -20 "$ref.log"; exit 1; }
export_weights "$ref" "$work/ref-export" || { echo "export of the reference failed"; exit 1; }
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
save_ms=$(grep -o 'checkpoint: .* (\([0-9]*\) ms)' "$ref.log" | grep -o '([0-9]* ms)' | tr -dc '0-9\n' | median)
save_what="median save of the reference"
if [[ $async == true ]]; then  # the background writes' own time, from an uninterrupted async run
  config "$work/ref-async" true
  train "$work/ref-async" || { echo "uninterrupted async run failed:"; tail -20 "$work/ref-async.log"; exit 1; }
  save_ms=$(grep -o 'written in the background in [0-9]* ms' "$work/ref-async.log" | tr -dc '0-9\n' | median)
  save_what="median background write of an uninterrupted async run"
fi
# The save's "(N ms)" also counts gathering the state before step-N.tmp exists; the directory itself lives a few ms
# to ~20 ms for the demo model here, so kill within min(N, 20) ms of its appearance.
max_delay=${GMOD_KILL_MAX_DELAY_MS:-$(( ${save_ms:-20} < 20 ? ${save_ms:-20} : 20 ))}
echo "kill_campaign: $trials trials, $np ranks, $steps steps, checkpoint every step$([[ $async == true ]] && echo ' (async)'), kill 0-$max_delay ms after a save starts"

pass=0
fail=0
inside=0
in_write=0
for ((i = 1; i <= trials; i++)); do
  run="$work/t$i"
  config "$run" "$async"
  target=$(( 2 + RANDOM % (steps - 2) ))
  delay=$(( RANDOM % (max_delay + 1) ))
  "${mpi[@]}" "$bin" train --threads 1 --config "$run.json" >> "$run.log" 2>&1 &
  mp=$!
  ranks=""
  for ((w = 0; w < 1200; w++)); do  # the ranks' pids, once they exist (children of mpirun)
    ranks=$(pgrep -P "$mp" | tr '\n' ' ')
    (( $(wc -w <<< "$ranks") >= np )) && break
    sleep 0.05
  done
  # From here on only builtins, so that the kill follows the save's start within microseconds: spin until
  # step-N.tmp exists, spin `delay` ms more, SIGKILL everything.
  t0=${EPOCHREALTIME/./}
  while [[ ! -d $run/checkpoints/step-$target.tmp ]]; do
    (( ${EPOCHREALTIME/./} - t0 > 120000000 )) && break
    kill -0 "$mp" 2> /dev/null || break
  done
  t1=$(( ${EPOCHREALTIME/./} + delay * 1000 ))
  while (( ${EPOCHREALTIME/./} < t1 )); do :; done
  # shellcheck disable=SC2086
  kill -9 "$mp" $ranks 2> /dev/null
  wait "$mp" 2> /dev/null
  complete=$(cd "$run/checkpoints" 2> /dev/null && ls -d step-* 2> /dev/null | grep -v '\.tmp$' | sort -t- -k2 -n | tail -1)
  stale=$(cd "$run/checkpoints" 2> /dev/null && ls -d step-*.tmp 2> /dev/null | tr '\n' ' ')
  : > "$run.log.resume"
  "${mpi[@]}" "$bin" train --threads 1 --config "$run.json" > "$run.log.resume" 2>&1
  rc=$?
  resumed=$(grep -o 'resume: /[^ ]*' "$run.log.resume" | head -1 | sed 's#.*/##')
  [[ -z $resumed ]] && resumed="(scratch: $(grep -o 'resume: no valid checkpoint' "$run.log.resume" | head -1))"
  skipped=$(grep -c 'skipped:' "$run.log.resume")
  verdict=FAIL
  if (( rc == 0 )) && export_weights "$run" "$run-export" && same_weights "$work/ref-export" "$run-export"; then
    verdict=ok
  fi
  [[ $verdict == ok ]] && pass=$((pass + 1)) || fail=$((fail + 1))
  if [[ -n $stale ]]; then
    landed="inside the save of ${stale%.tmp }"
    inside=$((inside + 1))
    if [[ $async == true ]]; then  # every rank's .sum file is the last thing its background write puts there
      aimed="$run/checkpoints/step-$target.tmp"  # the save the kill was aimed at (an older one may await its commit)
      [[ -d $aimed ]] || aimed="$run/checkpoints/${stale%% *}"
      sums=$(ls "$aimed"/*.sum 2> /dev/null | wc -l)
      if (( sums < np )); then
        landed+=" (in the background write, $sums/$np ranks done)"
        in_write=$((in_write + 1))
      else
        landed+=" (written, before the commit)"
      fi
    fi
  else
    landed="between saves"
  fi
  printf 'trial %2d: kill %3d ms after step-%d.tmp appeared landed %s; newest complete: %s; resumed from %s (%d passed over); resume rc %d; final weights %s\n' \
    "$i" "$delay" "$target" "$landed" "${complete:-none}" "$resumed" "$skipped" "$rc" \
    "$([[ $verdict == ok ]] && echo 'equal to the uninterrupted run' || echo 'DIFFER or missing')"
  [[ $verdict == ok ]] || tail -5 "$run.log.resume"
done
echo "kill_campaign: $pass/$trials trials ok, $fail failed; $inside kills landed inside a save$([[ $async == true ]] && echo ", $in_write inside its background write") ($save_what: ${save_ms:-?} ms)"
(( fail == 0 ))

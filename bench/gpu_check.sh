#!/usr/bin/env bash
# The one-shot check of gmod's GPU paths on a lent GPU machine (one GPU, a torch 2.11 CUDA 13 venv, nvcc, cmake,
# ninja; no MPI, HDF5 or the other Debian libraries gmod links). Building gmod there would spend most of the GPU
# time on a compile, so the binaries are built here (a CUDA-enabled build: CUDA toolkit present) and carried:
# Usage:
#   bench/gpu_check.sh --pack [BUILD] [OUT]   here: build gmod test_mod test_model mpi_parallel test_parallel test_trainer
#                                             bench_decode, copy them stripped with the Debian libraries they need and a
#                                             relocatable Open MPI into OUT/pack.tar.xz (default OUT .gpu-pack, git-ignored)
#   bench/gpu_check.sh [PACK]                 there, from the repository root, with PACK carried: runs the checks below
#   bench/gpu_check.sh --build                there, if the machine has gmod's Debian packages: build, then check
#   bench/gpu_check.sh --dry-run              here: the same run end to end on the CPU with ./build's binaries
#                                             (GMOD_BUILD_DIR), no configure or build; model.device=cpu, smaller decode
#                                             shape; CUDA cases SKIP; exit 0 when no part FAILed (ctest gpu_check_dry_run)
# GMOD_GPU_CHECK_PARTS="train,zero3" runs only those parts (the others: "SKIP not selected"). GMOD_GPU_CHECK_PLANT=NAME
# (--dry-run only; ignored, with a line saying so, on the GPU machine) plants one bug so that a verdict can be seen red
# (ctest gpu_check_planted, bench/gpu_check_planted.sh): gtest_rc (a test binary exits 1 after its cases passed),
# gtest_none (the filter matches no case), gtest_skip (cases skip while CUDA is claimed present), train_resume (the
# checkpoints are deleted before the resume, which then starts from scratch), train_weights (the resumed run gets
# 10x the learning rate), train_trace (the profiler trace is deleted), zero3 (the stage-3 run starts from other
# weights), zero3_stage (the "stage 3" run is stage 2), decode and mfu (their figure lines are removed from the log),
# mfu_plan (gmod plan is given a model it cannot read).
# The exact call on the GPU machine (run gives 600 s a command and returns only $OUT and the last 12,000 characters):
#   here:  bench/gpu_check.sh --pack
#   there: run with carry [".gpu-pack"], command `OUT=$OUT bench/gpu_check.sh`, timeout_s 590;
#          results under $OUT/gmod-gpu-check: verdict.txt, summary.json, one log per part
# Time: one deadline for the whole run, GMOD_GPU_DEADLINE_S (default 540, counted from the script's start). Each part
# has its own limit (below, they sum to 525 s); a part whose limit no longer fits in what is left is not run but
# recorded as "SKIP skipped: needs N s, M s left", and every command of a part runs under timeout bounded by
# min(its limit, what the part and the run have left).
# The checks (about 5-7 min of GPU time on an H200):
#   mod     (60 s) MoD on CUDA vs the CPU reference: the fused kernels' log-sum-exp for A-MoD scoring (mem-efficient
#           fp32, flash bf16), γ-MoD and A-MoD training forward + backward (test_mod MoDCuda.*)
#   llava   (45 s) LLaVA fp32 (TF32 off) on CUDA vs the transformers fixtures (test_model HfParityCuda.*:Fp32Precision.*)
#   nccl    (75 s) NCCL ZeRO stages 0-2 (and 3 where built) fp32/bf16 vs the reference, and the overlap hooks, 1 rank
#           (mpi_parallel ZeroNccl.*:OverlapNccl.*:Zero3Nccl.* as an MPI singleton; Zero3Nccl: ZeRO-3's gathers and
#           reductions on side streams)
#   offload (30 s) CPU-offloaded AdamW with pinned state and a device gradient, and ZeRO-2's bucket release on CUDA
#           (test_parallel OffloadCuda.*:BucketRelease.Cuda*)
#   ckptrng (20 s) the CUDA RNG state saved in a checkpoint and read back byte-exact, and whether the bilinear
#           backward / float cumsum run under deterministic CUDA (test_trainer CheckpointCudaRng.*:DeterministicCheck.Probes*)
#   train   (120 s) gmod train of configs/tiny_parts.json on one GPU: 4 steps with a checkpoint at step 2, a second run
#           stopped at step 2 and resumed (the log must say "resume: DIR (step 2, saved by ..."), and the two final
#           checkpoints' weights equal (exported by gmod export, safetensors compared); figure: mfu; the reference
#           run's step 3 is profiled (train/trace-step3.json: a Perfetto trace with the CUDA kernels and NCCL): FAIL
#           when the trace is missing, is not JSON with traceEvents, or (on CUDA) has no event of category "kernel";
#           its path, bytes, events and kernel events go to summary.json
#   zero3   (100 s) gmod train of configs/demo.json on one GPU with optimizer.zero_stage 3 (NCCL: ZeRO-3's unit gathers
#           and per-unit reductions on their side streams, γ-MoD's shared router as a persistent unit), 2 steps,
#           against the same 2 steps at stage 2: the per-step losses and gradient norms must agree (bitwise on the
#           CPU); figure: the largest relative difference
#   decode  (75 s) a measurement, not a check: bench_decode --cuda (LLaMA-shaped, hidden 1024, 12 layers, batches
#           1/8/32): dense vs γ-MoD next-token ms, the floor its routing decisions allow and the realised fraction
#           (docs/eval.md, "Decode speed"); PASS when it ran, its lines in the log and in summary.json
#   mfu     (150 s) a measurement, run last in what the checks left (else SKIP): bench_mod --cuda --bf16 on a
#           LLaMA-shaped ≈1B model (hidden 2048, 16 layers, 4 x 2048 tokens), activation checkpointing off and on:
#           dense vs γ-MoD step ms, tokens/s, TFLOP/s, MFU against the device's peak, peak allocated/reserved MiB;
#           beside them (summary.json memory_vs_plan, also in --dry-run) gmod plan's CUDA figures for the same shape, bf16,
#           1 rank: its peak and phase, weights, gradients, activations and AdamW state (bench_mod runs no optimizer,
#           so its peak compares with the plan's peak less optimizer_states); FAIL when gmod plan fails
# Prints one line per part (PASS / FAIL / SKIP and the figure that decided it) and "gpu_check: PASS" or
# "gpu_check: FAIL (parts)", with "[skipped: parts]" when any part skipped; exit code 1 on any failure. On the GPU
# machine a gtest case that skips (no usable device) is a FAIL. Logs: $GMOD_GPU_LOGS, default $TMPDIR/gmod-gpu-work/logs
# when OUT is set (a temp dir for --dry-run without OUT), else /tmp/gmod-gpu-check; verdict.txt is appended and
# summary.json (state, in_progress, parts: name, status, text, seconds and the part's figures) rewritten (temp file +
# mv: valid JSON whenever the run is killed) as each part finishes. The GPU machine returns at most 8 files from $OUT
# (16 MiB each), so $OUT/gmod-gpu-check gets three, refreshed the same way as each part starts and ends: verdict.txt,
# summary.json and logs.tgz (every log, the trace and the plans; without the trace if it would pass 15 MiB). Run dirs
# (checkpoints) go to $TMPDIR/gmod-gpu-work. NCCL_DEBUG=WARN.
set -uo pipefail
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
root="$(cd "$(dirname "$0")/.." && pwd)"
PY="${GMOD_PYTHON:-python3}"
TARGETS=(gmod test_mod test_model mpi_parallel test_parallel test_trainer bench_decode bench_mod)

# --- here: build and pack ----------------------------------------------------------------------------------------
# Copies FILE to OUT/sys/<its path without /usr> (the layout Open MPI relocates with OPAL_PREFIX=OUT/sys).
put() { local f=$1 d; d="$2/sys$(dirname "${f#/usr}")"; mkdir -p "$d" && cp -L "$f" "$d/"; }
pack() {
  local build=${1:-build} dest=${2:-$root/.gpu-pack} out
  out=$(mktemp -d "${TMPDIR:-/tmp}/gmod-gpu-pack-XXXXXX")
  grep -q 'GMOD_NCCL_LIB:FILEPATH=/' "$build/CMakeCache.txt" 2>/dev/null ||
    { echo "gpu_check --pack: $build is not a CUDA-enabled build (no NCCL found at configure)" >&2; return 1; }
  cmake --build "$build" --target "${TARGETS[@]}" || return 1
  mkdir -p "$out/bin" "$out/lib"
  local b
  for b in bin/gmod tests/mod/test_mod tests/model/test_model tests/parallel/mpi_parallel tests/parallel/test_parallel \
           tests/trainer/test_trainer bench/bench_decode bench/bench_mod; do
    strip -o "$out/bin/$(basename "$b")" "$build/$b" || return 1
  done
  # Libraries of the Debian packages (MPI, HDF5, SentencePiece, PCRE2, JPEG, PNG, ...) the binaries load; not
  # glibc/libstdc++ (the GPU machine has newer ones), not torch, CUDA or NCCL (its venv has them).
  ldd "$out"/bin/* | awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so|/torch/|/cuda|nccl|libcudart|libnvrtc|/nvidia/|/openmpi/|/pmix2/' |
    while read -r l; do cp -L "$l" "$out/lib/"; done
  # Open MPI (singleton: no daemon, MCA components loaded from the relocated prefix) and PMIx.
  local m=/usr/lib/x86_64-linux-gnu
  for f in "$m"/openmpi/lib/*.so* "$m"/openmpi/lib/openmpi3/*.so "$m"/pmix2/lib/*.so* "$m"/pmix2/lib/pmix/*.so; do
    [[ -e $f ]] && put "$f" "$out"
  done
  [[ -d /usr/share/openmpi ]] && mkdir -p "$out/sys/share" && cp -r /usr/share/openmpi "$out/sys/share/"
  [[ -d /usr/share/pmix ]] && cp -r /usr/share/pmix "$out/sys/share/"
  ldd "$m"/openmpi/lib/openmpi3/*.so "$m"/pmix2/lib/pmix/*.so 2>/dev/null | awk '$3 ~ /^\// { print $3 }' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|/openmpi/|/pmix2/' |
    while read -r l; do [[ -e $out/lib/$(basename "$l") ]] || cp -L "$l" "$out/lib/"; done
  # One compressed file: the carried tree has a size limit (64 MiB with the repository).
  rm -rf "$dest" && mkdir -p "$dest" && tar -C "$out" -cJf "$dest/pack.tar.xz" . && rm -rf "$out" || return 1
  echo "gpu_check --pack: $(du -sh "$dest/pack.tar.xz" | cut -f1) in $dest/pack.tar.xz; carry it (run: carry [\"${dest#"$root"/}\"])"
}

# --- there: environment, checks, verdict -------------------------------------------------------------------------
setup_env() {  # PACK
  local pack=$1 tl site
  tl=$("$PY" -c 'import os,torch;print(os.path.join(os.path.dirname(torch.__file__),"lib"))') ||
    { echo "gpu_check: $PY cannot import torch (set GMOD_PYTHON)"; return 1; }
  site=$(dirname "$(dirname "$tl")")
  local nv
  nv=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="$pack/lib:$pack/sys/lib/x86_64-linux-gnu/openmpi/lib:$pack/sys/lib/x86_64-linux-gnu/pmix2/lib:$tl:$nv${LD_LIBRARY_PATH:-}"
  export OPAL_PREFIX="$pack/sys" PMIX_INSTALL_PREFIX="$pack/sys" OMPI_MCA_ess_singleton_isolated=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=4
  export GMOD_SOURCE_DIR="$root"
}

# --- the run: one deadline, per-part limits, logs and summary under $LOGS ----------------------------------------
DEADLINE=${GMOD_GPU_DEADLINE_S:-540}
WORK=${TMPDIR:-/tmp}/gmod-gpu-work  # run dirs (checkpoints, exports): large, so not under $OUT
LOGS=${GMOD_GPU_LOGS:-${OUT:+$WORK/logs}}
LOGS=${LOGS:-/tmp/gmod-gpu-check}
RES=${OUT:+$OUT/gmod-gpu-check}  # what comes back: verdict.txt, summary.json, logs.tgz (publish)
CUDA=False DEV=cuda MODE=gpu
export NCCL_DEBUG=WARN
declare -a VERDICT=() FAILED=() SKIPPED=()
PARTS=${GMOD_GPU_CHECK_PARTS:-} PLANT=""  # PLANT is set from GMOD_GPU_CHECK_PLANT in --dry-run only (main)
PLANTS="gtest_rc gtest_none gtest_skip train_resume train_weights train_trace zero3 zero3_stage decode mfu mfu_plan"
planted() { [[ -n $PLANT && $PLANT == "$1" ]]; }
PART="" PART_T0=0 PART_END=0 EXTRA=""
left() { echo $((DEADLINE - SECONDS)); }
# sub N: the time limit of one command of the current part: min(N, what the part has left, what the run has left).
sub() {
  local n=$1 p=$((PART_END - SECONDS)) g; g=$(left)
  ((p < n)) && n=$p
  ((g < n)) && n=$g
  ((n < 1)) && n=1
  echo "$n"
}
# Rewrites $LOGS/summary.json from $LOGS/parts.tsv (one finished part a line); temp file + mv, so the file is valid
# JSON whenever the run is killed. STATE: running (IN_PROGRESS: the part now running) or the final verdict.
summary() {  # STATE [IN_PROGRESS]
  "$PY" - "$LOGS/parts.tsv" "$LOGS/summary.json.tmp" "$1" "${2:-}" "$MODE" "$CUDA" "$DEADLINE" "$SECONDS" "$PLANT" <<'PYEOF' &&
import json, sys
tsv, out, state, cur, mode, cuda, deadline, elapsed, plant = sys.argv[1:10]
parts = []
try:
    lines = open(tsv, encoding="utf-8", errors="replace").read().splitlines()
except FileNotFoundError:
    lines = []
for line in lines:
    f = line.split("\t")
    if len(f) < 4:
        continue
    p = {"name": f[0], "status": f[1], "seconds": int(f[2]), "text": f[3]}
    for kv in f[4:]:
        k, _, v = kv.partition("=")
        if k.endswith("_json"):
            try:
                p[k[:-5]] = json.loads(v)
            except ValueError:
                p[k] = v
            continue
        if k.endswith("_lines"):
            p[k] = [x.strip() for x in v.split(";") if x.strip()]
            continue
        for conv in (int, float, str):
            try:
                p[k] = conv(v)
                break
            except ValueError:
                pass
    parts.append(p)
json.dump({"state": state, "in_progress": cur or None, "mode": mode, "cuda": cuda == "True",
           "deadline_s": int(deadline), "elapsed_s": int(elapsed), "planted": plant or None, "parts": parts},
          open(out, "w"), indent=1)
PYEOF
  mv -f "$LOGS/summary.json.tmp" "$LOGS/summary.json"
  publish
}
# publish [logs]: copies verdict.txt and summary.json to $RES (temp file + mv), with "logs" also $LOGS as logs.tgz.
publish() {
  [[ -n $RES && $RES != "$LOGS" ]] || return 0
  mkdir -p "$RES" && local f
  for f in verdict.txt summary.json; do
    [[ -f $LOGS/$f ]] && cp "$LOGS/$f" "$RES/$f.tmp" && mv -f "$RES/$f.tmp" "$RES/$f"
  done
  [[ ${1:-} == logs ]] || return 0
  tar -C "$LOGS" -czf "$RES/logs.tgz.tmp" . 2>/dev/null
  (($(stat -c %s "$RES/logs.tgz.tmp" 2>/dev/null || echo 0) > 15 << 20)) &&
    tar -C "$LOGS" --exclude='trace-*.json' -czf "$RES/logs.tgz.tmp" . 2>/dev/null
  mv -f "$RES/logs.tgz.tmp" "$RES/logs.tgz"
}
flat() { tr '\t\n' '  ' | tr -s ' '; }
verdict() {  # PART STATUS TEXT (EXTRA: tab-separated key=value figures of the part)
  local secs=$((SECONDS - PART_T0)) line
  line=$(printf '%-7s %-4s %s' "$1" "$2" "$3")
  VERDICT+=("$line")
  [[ $2 == FAIL ]] && FAILED+=("$1")
  [[ $2 == SKIP ]] && SKIPPED+=("$1")
  echo "== $1: $2 $3"
  echo "$line" >>"$LOGS/verdict.txt"
  printf '%s\t%s\t%s\t%s%s\n' "$1" "$2" "$secs" "$(printf '%s' "$3" | flat)" "${EXTRA:+	$EXTRA}" >>"$LOGS/parts.tsv"
  EXTRA=""
  summary running
  publish logs
}
# part NAME LIMIT_S FUNCTION ARGS...: runs the part when its limit fits in what the run has left, else a named SKIP.
part() {
  local name=$1 limit=${2}; shift 2
  local l; l=$(left)
  PART=$name PART_T0=$SECONDS PART_END=$((SECONDS + limit)) EXTRA=""
  if [[ -n $PARTS && ,${PARTS// /,}, != *,$name,* ]]; then verdict "$name" SKIP "not selected (GMOD_GPU_CHECK_PARTS)"; return; fi
  if ((limit > l)); then verdict "$name" SKIP "skipped: needs $limit s, $((l < 0 ? 0 : l)) s left"; return; fi
  summary running "$name"
  "$@"
}
# gtest BIN FILTER: PASS when the cases ran and passed, SKIP when they skipped (no device).
gtest() {
  local bin=$1 filter=$2 log="$LOGS/$PART.log" rc lim cuda=$CUDA; lim=$(sub 100000)
  planted gtest_none && filter='NoSuchSuite.*'  # a renamed suite: the filter selects nothing
  timeout -k 5 "$lim" "$bin" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  planted gtest_rc && rc=1     # a crash at exit after the cases passed
  planted gtest_skip && cuda=True  # the cases skip (no device) where CUDA was found
  local passed skipped
  passed=$(grep '^\[       OK \]' "$log" | awk '{print $4}' | sort -u | wc -l)
  skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$log" | awk '{print $4}' | sort -u | wc -l)
  local why
  why=$(grep -m1 -A1 'Skipped$' "$log" | tail -1)
  EXTRA="passed=$passed	skipped=$skipped"
  # On the GPU machine a skip means the device was not usable: that fails the check.
  if [[ $rc -eq 0 && $skipped -gt 0 && $cuda == True ]]; then verdict "$PART" FAIL "$skipped case(s) skipped with CUDA available: $why"
  elif [[ $rc -eq 0 && $skipped -gt 0 ]]; then verdict "$PART" SKIP "$skipped case(s) skipped, $passed passed: $why"
  elif [[ $rc -eq 0 && $passed -gt 0 ]]; then verdict "$PART" PASS "$passed case(s) ($filter)"
  elif [[ $rc -eq 0 ]]; then verdict "$PART" FAIL "rc 0 but no case passed or skipped: the filter $filter selects none (log $log)"
  else verdict "$PART" FAIL "rc $rc$([[ $rc == 124 || $rc == 137 ]] && echo " (over ${lim}s)"), log $log: $(grep -m1 -E 'Failure|error|Error' "$log")"
  fi
}

# check_trace FILE: "ok BYTES EVENTS KERNEL_EVENTS" when FILE is a JSON trace with traceEvents (on CUDA also events of
# category "kernel": the profiler saw the GPU), else "FAIL why".
check_trace() {
  timeout -k 5 "$(sub 60)" "$PY" - "$1" "$CUDA" <<'PYEOF' || echo "FAIL reading the profiler trace $1 timed out or crashed"
import json, os, sys
path, cuda = sys.argv[1], sys.argv[2] == "True"
try:
    size = os.path.getsize(path)
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
except (OSError, ValueError) as e:
    print(f"FAIL profiler trace {path}: {type(e).__name__}: {str(e)[:200]}")
    sys.exit()
ev = d.get("traceEvents") if isinstance(d, dict) else None
if not isinstance(ev, list) or not ev:
    print(f"FAIL profiler trace {path}: no traceEvents list (or an empty one)")
    sys.exit()
kernels = sum(1 for e in ev if isinstance(e, dict) and e.get("cat") == "kernel")
if cuda and kernels == 0:
    print(f"FAIL profiler trace {path}: {len(ev)} events, none of category \"kernel\" (no CUDA kernel recorded)")
    sys.exit()
print(f"ok {size} {len(ev)} {kernels}")
PYEOF
}

# The step the stopped run saved and the resumed run must name: "resume: DIR (step 2, saved by ..." is the line
# trainer/trainer_resume.cpp prints when it resumed ("resume: no valid checkpoint ..." when it did not).
RESUME_STEP=2
check_train() {  # BINDIR
  local gmod=$1/gmod w="$WORK/train" lg="$LOGS/train" rc
  rm -rf "$w" "$lg" && mkdir -p "$w" "$lg"
  local sets=(--set model.device=$DEV --set data.train="$w/data/train.json" --set checkpoint.every=2
              --set checkpoint.keep_last=0 --set parallel.timeout_s=120 --set deterministic=true)
  export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS, which deterministic=true asks for
  (cd "$root" && timeout -k 5 "$(sub 150)" "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/ref" \
    --set resume=none --profile-steps 3-3) >"$lg/ref.log" 2>&1 ||
    { verdict train FAIL "uninterrupted run rc $?: $(grep -m1 -i error "$lg/ref.log")"; return; }
  local tr="$lg/trace-step3.json" t tb te tk
  cp "$w"/ref/profile/trace-rank-0-steps-3-3.json "$tr" 2>/dev/null  # Perfetto: kernels, NCCL (missing: named below)
  planted train_trace && rm -f "$tr"
  t=$(check_trace "$tr")
  [[ $t == ok\ * ]] || { verdict train FAIL "${t#FAIL }"; return; }
  read -r _ tb te tk <<<"$t"
  EXTRA="trace_path=train/trace-step3.json"$'\t'"trace_bytes=$tb"$'\t'"trace_events=$te"$'\t'"trace_kernels=$tk"
  (cd "$root" && timeout -k 5 "$(sub 90)" "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/res" \
    --set resume=none --set schedule.exit_at_step=2) >"$lg/stop.log" 2>&1 ||
    { verdict train FAIL "run stopped at step 2: rc $?: $(grep -m1 -i error "$lg/stop.log")"; return; }
  planted train_resume && rm -rf "$w/res/checkpoints"     # the resume then starts from scratch
  local more=(); planted train_weights && more=(--set optimizer.lr=2e-3)  # steps 3-4 with 10x the lr
  (cd "$root" && timeout -k 5 "$(sub 90)" "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/res" \
    --set resume=auto "${more[@]}") >"$lg/resume.log" 2>&1 ||
    { verdict train FAIL "resumed run rc $?: $(grep -m1 -i error "$lg/resume.log")"; return; }
  grep -qE "resume: .* \(step $RESUME_STEP, saved by " "$lg/resume.log" ||
    { verdict train FAIL "the second run did not resume from step $RESUME_STEP: $(grep -m1 'resume: ' "$lg/resume.log") (log $lg/resume.log)"; return; }
  local a b r
  for r in ref res; do
    (cd "$root" && timeout -k 5 "$(sub 60)" "$gmod" export --checkpoint "$w/$r" --out "$w/$r-hf") >"$lg/export-$r.log" 2>&1 ||
      { verdict train FAIL "export of $r rc $?: $(tail -1 "$lg/export-$r.log")"; return; }
  done
  cp "$w/ref/metrics.jsonl" "$lg/ref-metrics.jsonl" 2>/dev/null
  a=$(cat "$w"/ref-hf/*.safetensors | md5sum) b=$(cat "$w"/res-hf/*.safetensors | md5sum)
  local mfu
  mfu=$(grep -o '"mfu": *[0-9.e-]*' "$w/ref/metrics.jsonl" | tail -1)
  [[ -n $mfu ]] && EXTRA+=$'\t'"mfu=${mfu##*[: ]}"
  if [[ $a == "$b" ]]; then verdict train PASS "4 steps on $DEV, saved, stopped at 2, resumed: weights equal ($mfu; trace $tb bytes, $te events, $tk kernel)"
  else verdict train FAIL "resumed weights differ from the uninterrupted run's"; fi
}

DECODE_ARGS=(--cuda --only llama --batches 1,8,32 --new 32 --reps 2)
check_decode() {  # BIN
  local log="$LOGS/decode.log" rc lim; lim=$(sub 150)
  timeout -k 5 "$lim" "$1" "${DECODE_ARGS[@]}" >"$log" 2>&1
  rc=$?
  planted decode && sed -i '/realised-of-achievable/d' "$log"  # a bench that exits 0 without its figures
  if [[ $rc -eq 0 ]] && grep -q 'realised-of-achievable' "$log"; then
    local lines; lines=$(grep -E '^ batch|next token \(wall\)|realised-of-achievable' "$log" | tr -s ' ' | tr '\n' ';' | tr '\t' ' ')
    EXTRA="decode_lines=$lines"
    verdict decode PASS "$lines"
  else verdict decode FAIL "rc $rc$([[ $rc == 124 || $rc == 137 ]] && echo " (over ${lim}s)"), $(grep -c 'realised-of-achievable' "$log") realised-of-achievable lines, log $log: $(grep -m1 -iE 'error' "$log")"
  fi
}

# A measurement, not a check: dense vs γ-MoD bf16 training steps of a LLaMA-shaped ≈1B-parameter model (hidden
# 2048, 16 layers, 4 x 2048 tokens), activation checkpointing off and on: step time, tokens/s, TFLOP/s, MFU against
# the device's peak, peak allocated / reserved memory (bench_mod --bf16).
MFU_ARGS=(--cuda --bf16 --hidden 2048 --layers 16 --seq 2048 --batch 4 --iters 3 --lengths equal --no-decode)
check_mfu() {  # BIN GMOD
  local log="$LOGS/mfu.log" rc=0 ck lines="" cmp
  : >"$log"
  for ck in none full; do
    timeout -k 5 "$(sub 150)" "$1" "${MFU_ARGS[@]}" --checkpointing $ck >>"$log" 2>&1 || { rc=$?; break; }
  done
  planted mfu && sed -i '/ train step /d' "$log"  # a bench that exits 0 without its figures
  lines=$(grep -E 'activation checkpointing|train step|realised saving' "$log" | tr -s ' ' | tr '\n' ';' | tr '\t' ' ')
  if [[ $rc -ne 0 || $(grep -c ' train step ' "$log") -lt 4 ]]; then
    verdict mfu FAIL "rc $rc$([[ $rc == 124 || $rc == 137 ]] && echo " (over the limit)"), $(grep -c ' train step ' "$log") train step lines of 4, log $log: $(grep -m1 -iE 'error' "$log")"
    return
  fi
  cmp=$(mfu_plan "$2" "$log")
  if [[ $cmp != ok\ * ]]; then verdict mfu FAIL "${cmp#FAIL }"; return; fi
  EXTRA="mfu_lines=$lines"$'\t'"memory_vs_plan_json=${cmp#ok }"
  verdict mfu PASS "$lines"
}

mfu_arg() {  # NAME: its value in MFU_ARGS
  local i
  for ((i = 0; i + 1 < ${#MFU_ARGS[@]}; ++i)); do [[ ${MFU_ARGS[i]} == "$1" ]] && { echo "${MFU_ARGS[i + 1]}"; return; }; done
}
# mfu_plan GMOD LOG: "ok JSON" (one line: per variant and checkpointing, the peaks bench_mod measured beside gmod plan's
# CUDA figures for its shape: bf16, 1 rank, ZeRO-0, micro-batch = its batch, max_len = its seq, γ-MoD on its layers
# 1..L-2 keeping 1 - 0.5 * 5/8 of the tokens, its routable share), or "FAIL why". Plans under $LOGS/mfu-plan/.
mfu_plan() {
  local gmod=$1 log=$2 d="$LOGS/mfu-plan" m="$WORK/mfu-plan" h l s b mem=80 v ck rc i mods=""
  h=$(mfu_arg --hidden) l=$(mfu_arg --layers) s=$(mfu_arg --seq) b=$(mfu_arg --batch)
  local dt=fp32; [[ " ${MFU_ARGS[*]} " == *" --bf16 "* ]] && dt=bf16
  [[ -n $h && -n $l && -n $s && -n $b ]] || { echo "FAIL MFU_ARGS lacks --hidden, --layers, --seq or --batch"; return; }
  planted mfu_plan && h=0  # a model gmod plan cannot read
  for ((i = 1; i + 1 < l; ++i)); do mods+="${mods:+,}$i"; done
  [[ $CUDA == True ]] && mem=$(timeout 20 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
    awk 'NR == 1 { printf "%d", $1 / 1024 }')
  [[ $mem =~ ^[1-9][0-9]*$ ]] || mem=80
  rm -rf "$d" "$m" && mkdir -p "$d" "$m/model" || { echo "FAIL cannot create $d"; return; }
  printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": %d, "intermediate_size": %d,
  "num_hidden_layers": %d, "num_attention_heads": %d, "num_key_value_heads": %d, "head_dim": 64, "vocab_size": 1000,
  "max_position_embeddings": %d, "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "hidden_act": "silu"}\n' \
    "$h" $((h * 8 / 3)) "$l" $((h / 64)) $((h / 64)) $((s > 4096 ? s : 4096)) >"$m/model/config.json"
  for v in dense gamma-MoD; do
    for ck in none full; do
      local sets=(--set model.dtype="$dt" --set model.device=cuda --set batch.micro_batch="$b" --set batch.global_batch="$b"
                  --set data.max_len="$s" --set optimizer.zero_stage=0 --set mod.enabled=false)
      [[ $v == gamma-MoD ]] && sets+=(--set mod.enabled=true --set mod.config.router=gamma_shared
                                      --set "mod.config.mod_layers_idx=[$mods]" --mod-kept 0.6875)
      (cd "$root" && timeout -k 5 "$(sub 30)" "$gmod" plan configs/demo.json --model "$m/model" --world 1 --gpu-mem "$mem" \
        --checkpointing $ck "${sets[@]}" --json "$d/$v-$ck.json") >"$d/$v-$ck.log" 2>&1
      rc=$?
      # 3: the plan does not fit --gpu-mem, a figure like the others here
      ((rc == 0 || rc == 3)) || { echo "FAIL gmod plan ($v, checkpointing $ck) rc $rc: $(grep -m1 -iE 'error|problem|invalid' "$d/$v-$ck.log") (log $d/$v-$ck.log)"; return; }
    done
  done
  timeout -k 5 "$(sub 30)" "$PY" - "$d" "$log" <<'PYEOF' || echo "FAIL comparing bench_mod's peaks with gmod plan's"
import json, re, sys
d, log = sys.argv[1:3]
mib = lambda x: round(x / 2**20, 1)
measured, ck = {}, None
for line in open(log, encoding="utf-8", errors="replace"):
    m = re.search(r"activation checkpointing (\w+)", line)
    if m:
        ck = m.group(1)
    m = re.match(r"(\S+)\s+train step .*peak allocated (\d+) MiB, reserved (\d+) MiB", line)
    if m:
        measured[(m.group(1), ck)] = (int(m.group(2)), int(m.group(3)))
rows = []
for v in ("dense", "gamma-MoD"):
    for ck in ("none", "full"):
        p = json.load(open(f"{d}/{v}-{ck}.json"))
        t = p["terms"]
        # What a data-parallel optimizer holds and bench_mod (forward + backward only) does not.
        opt = sum(t.get(k, 0) for k in ("optimizer_states", "optimizer_transient", "reduced_grad_shard", "grad_accum_fp32",
                                        "comm_inflight"))
        a, r = measured.get((v, ck), (None, None))
        rows.append({"variant": v, "checkpointing": ck, "measured_allocated_mib": a, "measured_reserved_mib": r,
                     "plan_peak_mib": mib(p["total_bytes"]), "plan_peak_phase": p["peak_phase"],
                     "plan_peak_without_optimizer_mib": mib(p["total_bytes"] - opt),
                     "plan_weights_mib": mib(t.get("weights", 0)), "plan_gradients_mib": mib(t.get("gradients", 0)),
                     "plan_activations_mib": mib(t.get("activations", 0)),
                     "plan_optimizer_states_mib": mib(t.get("optimizer_states", 0)), "plan_fits": p.get("fits"),
                     "plan_file": f"mfu-plan/{v}-{ck}.json"})
print("ok " + json.dumps(rows, separators=(",", ":")))
PYEOF
}

check_train_zero3() {  # BINDIR
  local gmod=$1/gmod w="$WORK/zero3" lg="$LOGS/zero3" st
  rm -rf "$w" "$lg" && mkdir -p "$w" "$lg"
  local sets=(--set model.device=$DEV --set data.train="$w/data/train.json" --set eval.data="$w/data/heldout.json"
              --set schedule.max_steps=2 --set metrics.log_every=1 --set parallel.timeout_s=120
              --set deterministic=true --set resume=none)
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  local run more
  for st in 2 3; do
    run=$st more=()
    [[ $st == 3 ]] && planted zero3 && more=(--set model.init_seed=1)  # stage 3 starts from other weights
    [[ $st == 3 ]] && planted zero3_stage && run=2                      # the "stage 3" run is stage 2
    (cd "$root" && timeout -k 5 "$(sub 150)" "$gmod" train --config configs/demo.json "${sets[@]}" --set optimizer.zero_stage=$run \
      --set run_dir="$w/z$st" "${more[@]}") >"$lg/z$st.log" 2>&1 ||
      { verdict zero3 FAIL "stage $st run rc $?: $(grep -m1 -i error "$lg/z$st.log")"; return; }
    cp "$w/z$st/metrics.jsonl" "$lg/z$st-metrics.jsonl" 2>/dev/null
  done
  grep -q "optimizer: ZeRO-3, " "$lg/z3.log" || { verdict zero3 FAIL "the stage-3 run did not use ZeRO-3 (log $lg/z3.log)"; return; }
  local cmp
  cmp=$(timeout -k 5 "$(sub 30)" "$PY" - "$w/z2/metrics.jsonl" "$w/z3/metrics.jsonl" <<'PYEOF'
import json, math, sys
def steps(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "step" in r and "loss" in r:
            out[r["step"]] = r
    return out
a, b = steps(sys.argv[1]), steps(sys.argv[2])
if sorted(a) != sorted(b) or len(a) < 2:
    print(f"FAIL steps logged: stage 2 {sorted(a)}, stage 3 {sorted(b)}")
    sys.exit()
worst = 0.0
for k in a:
    for f in ("loss", "grad_norm"):
        x, y = float(a[k].get(f, "nan")), float(b[k].get(f, "nan"))
        if not (math.isfinite(x) and math.isfinite(y)):
            print(f"FAIL step {k} {f}: stage 2 {x}, stage 3 {y}")
            sys.exit()
        worst = max(worst, abs(x - y) / max(abs(x), 1e-30))
print(("PASS" if worst <= 1e-4 else "FAIL") + f" 2 steps, loss and grad_norm vs stage 2: largest relative difference {worst:.2e}")
PYEOF
)
  [[ $cmp == PASS* || $cmp == FAIL* ]] || cmp="FAIL comparing the metrics: ${cmp:-no output}"
  [[ $cmp =~ difference\ ([0-9.e+-]+) ]] && EXTRA="max_rel_diff=${BASH_REMATCH[1]}"
  verdict zero3 "${cmp%% *}" "${cmp#* }"
}

main() {
  local mode=${1:-} pack bindir
  if [[ $mode == --pack ]]; then shift; pack "$@"; return; fi
  if [[ -n ${GMOD_GPU_CHECK_PLANT:-} && $mode != --dry-run ]]; then
    echo "gpu_check: GMOD_GPU_CHECK_PLANT=$GMOD_GPU_CHECK_PLANT ignored: bugs are planted in --dry-run only"
  elif [[ -n ${GMOD_GPU_CHECK_PLANT:-} ]]; then
    [[ " $PLANTS " == *" $GMOD_GPU_CHECK_PLANT "* ]] ||
      { echo "gpu_check: GMOD_GPU_CHECK_PLANT=$GMOD_GPU_CHECK_PLANT is none of: $PLANTS" >&2; return 2; }
    PLANT=$GMOD_GPU_CHECK_PLANT
  fi
  if [[ $mode == --dry-run && -z ${GMOD_GPU_LOGS:-} && -z ${OUT:-} ]]; then LOGS=$(mktemp -d "${TMPDIR:-/tmp}/gmod-gpu-check-XXXXXX"); fi
  rm -f "$LOGS/verdict.txt" "$LOGS/parts.tsv" "$LOGS/summary.json"
  [[ -n $RES ]] && rm -f "$RES/verdict.txt" "$RES/summary.json" "$RES/logs.tgz"
  mkdir -p "$LOGS" || return 1
  if [[ $mode == --build || $mode == --dry-run ]]; then
    if [[ $mode == --build ]]; then
      cmake -S "$root" -B "$root/build-gpu" -G Ninja -DGMOD_PYTHON="$(command -v "$PY")" >"$LOGS/cfg.log" 2>&1 ||
        { tail -20 "$LOGS/cfg.log"; return 1; }
      cmake --build "$root/build-gpu" -j "$(nproc)" --target "${TARGETS[@]}" >"$LOGS/build.log" 2>&1 ||
        { tail -20 "$LOGS/build.log"; return 1; }
      bindir="$root/build-gpu"
    else
      bindir="${GMOD_BUILD_DIR:-$root/build}" MODE=dry-run DEV=cpu
      [[ -z ${GMOD_PYTHON:-} ]] && PY=$(sed -n 's/^GMOD_PYTHON:[A-Z]*=//p' "$bindir/CMakeCache.txt" 2>/dev/null) && PY=${PY:-python3}
      DECODE_ARGS=(--only llama --batches 1,2 --new 4 --reps 1 --hidden 128 --layers 3 --seq 100 --demo-seq 100)
      MFU_ARGS=(--hidden 128 --layers 4 --seq 128 --batch 2 --iters 1 --lengths equal --no-decode)
    fi
    pack=""
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GMOD_SOURCE_DIR="$root"
  else
    local carried=${mode:-$root/.gpu-pack}
    [[ -f $carried/pack.tar.xz ]] ||
      { echo "gpu_check: no $carried/pack.tar.xz (bench/gpu_check.sh --pack here, then carry it)"; return 1; }
    pack=${TMPDIR:-/tmp}/gmod-gpu-pack
    rm -rf "$pack" && mkdir -p "$pack" && tar -C "$pack" -xJf "$carried/pack.tar.xz" || return 1
    setup_env "$pack" || return 1
  fi
  echo "gpu_check: mode $MODE, deadline ${DEADLINE}s, logs in $LOGS${PARTS:+, parts $PARTS}${PLANT:+, planted bug $PLANT}"
  command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  timeout 60 "$PY" -c 'import torch;print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())'
  CUDA=$(timeout 60 "$PY" -c 'import torch;print(torch.cuda.is_available())' 2>/dev/null)
  [[ $MODE == dry-run ]] && CUDA=False
  summary running
  local b="${bindir:-$pack/bin}"
  local tm=$b/test_mod tmo=$b/test_model mp=$b/mpi_parallel tp=$b/test_parallel tt=$b/test_trainer g=$b/gmod bd=$b/bench_decode
  local bm=$b/bench_mod
  if [[ -n ${bindir:-} ]]; then
    tm=$b/tests/mod/test_mod tmo=$b/tests/model/test_model mp=$b/tests/parallel/mpi_parallel
    tp=$b/tests/parallel/test_parallel tt=$b/tests/trainer/test_trainer g=$b/bin/gmod bd=$b/bench/bench_decode
    bm=$b/bench/bench_mod
  fi
  # Part limits sum to 525 s, inside the default deadline of 540 s (and run's 600 s a command); mfu (a measurement)
  # comes last and runs only in what the checks left (SKIP otherwise).
  part mod     60 gtest "$tm" 'MoDCuda.*'
  part llava   45 gtest "$tmo" 'HfParityCuda.*:Fp32Precision.*'
  part nccl    75 gtest "$mp" 'ZeroNccl.*:OverlapNccl.*:Zero3Nccl.*'
  part offload 30 gtest "$tp" 'OffloadCuda.*:BucketRelease.Cuda*'
  part ckptrng 20 gtest "$tt" 'CheckpointCudaRng.*:DeterministicCheck.Probes*'
  part train  120 check_train "$(dirname "$g")"
  part zero3  100 check_train_zero3 "$(dirname "$g")"
  part decode  75 check_decode "$bd"
  part mfu    150 check_mfu "$bm" "$g"
  local v
  if [[ ${#FAILED[@]} -eq 0 ]]; then v="gpu_check: PASS"; else v="gpu_check: FAIL (${FAILED[*]})"; fi
  [[ ${#SKIPPED[@]} -gt 0 ]] && v+=" [skipped: ${SKIPPED[*]}]"
  echo "---- gpu_check verdict ($SECONDS s)"
  printf '%s\n' "${VERDICT[@]}"
  echo "$v" | tee -a "$LOGS/verdict.txt"
  summary "${v#gpu_check: }"
  publish logs
  [[ ${#FAILED[@]} -eq 0 ]]
}

main "$@"

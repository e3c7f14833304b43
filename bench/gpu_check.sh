#!/usr/bin/env bash
# The one-shot check of gmod's GPU paths on a lent GPU machine (one GPU, a torch 2.11 CUDA 13 venv, nvcc, cmake,
# ninja; no MPI, HDF5 or the other Debian libraries gmod links). Building gmod there would spend most of the GPU
# time on a compile, so the binaries are built here (a CUDA-enabled build: CUDA toolkit present) and carried:
# Usage:
#   bench/gpu_check.sh --pack [BUILD] [OUT]   here: build gmod test_mod test_model mpi_parallel, copy them stripped
#                                             with the Debian libraries they need and a relocatable Open MPI into
#                                             OUT/pack.tar.xz (default OUT .gpu-pack, git-ignored)
#   bench/gpu_check.sh [PACK]                 there, from the repository root, with PACK carried (run's carry:
#                                             [".gpu-pack"]): runs the checks below and prints a verdict
#   bench/gpu_check.sh --build                there, if the machine has gmod's Debian packages: build, then check
# The checks (about 5-7 min of GPU time on an H200; each part has its own time limit, the whole run 10 min at most):
#   mod     MoD on CUDA vs the CPU reference: the fused kernels' log-sum-exp for A-MoD scoring (mem-efficient fp32,
#           flash bf16), γ-MoD and A-MoD training forward + backward (test_mod MoDCuda.*)
#   llava   LLaVA fp32 on CUDA vs the transformers fixtures (test_model HfParityCuda.*)
#   nccl    NCCL ZeRO stages 0-2 (and 3 where built) fp32/bf16 vs the reference, and the overlap hooks, 1 rank
#           (mpi_parallel ZeroNccl.*:OverlapNccl.*:Zero3Nccl.* as an MPI singleton; Zero3Nccl: ZeRO-3's gathers and
#           reductions on side streams)
#   train   gmod train of configs/tiny_parts.json on one GPU: 4 steps with a checkpoint at step 2, a second run stopped
#           at step 2 and resumed, and the two final checkpoints' weights equal (h5 files compared by gmod export)
#   zero3   gmod train of configs/demo.json on one GPU with optimizer.zero_stage 3 (NCCL: ZeRO-3's unit gathers and
#           per-unit reductions on their side streams, γ-MoD's shared router as a persistent unit), 2 steps, against
#           the same 2 steps at stage 2: the per-step losses and gradient norms must agree (bitwise on the CPU;
#           prints the largest relative difference)
#   decode  a measurement, not a check: bench_decode --cuda (LLaMA-shaped, hidden 1024, 12 layers, batches 1/8/32):
#           dense vs γ-MoD next-token ms, the floor its routing decisions allow and the realised fraction
#           (docs/eval.md, "Decode speed"); PASS when it ran, its lines in the log
# Prints one line per part (PASS / FAIL / SKIP and the figure that decided it) and "gpu_check: PASS" or
# "gpu_check: FAIL (parts)"; exit code 1 on any failure. Logs: $GMOD_GPU_LOGS (default /tmp/gmod-gpu-check).
set -uo pipefail
[[ ${1:-} == --help || ${1:-} == -h ]] && { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0; }
root="$(cd "$(dirname "$0")/.." && pwd)"
PY="${GMOD_PYTHON:-python3}"
TARGETS=(gmod test_mod test_model mpi_parallel bench_decode)

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
  for b in bin/gmod tests/mod/test_mod tests/model/test_model tests/parallel/mpi_parallel bench/bench_decode; do
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

LOGS=${GMOD_GPU_LOGS:-/tmp/gmod-gpu-check}
CUDA=False
declare -a VERDICT=() FAILED=()
verdict() {  # PART STATUS TEXT
  VERDICT+=("$(printf '%-6s %-4s %s' "$1" "$2" "$3")")
  [[ $2 == FAIL ]] && FAILED+=("$1")
  echo "== $1: $2 $3"
}
# gtest PART LIMIT_S BIN FILTER: PASS when the cases ran and passed, SKIP when they skipped (no device).
gtest() {
  local part=$1 limit=$2 bin=$3 filter=$4 log="$LOGS/$1.log" rc
  timeout "$limit" "$bin" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  local passed skipped
  passed=$(grep '^\[       OK \]' "$log" | awk '{print $4}' | sort -u | wc -l)
  skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' "$log" | awk '{print $4}' | sort -u | wc -l)
  local why
  why=$(grep -m1 -A1 'Skipped$' "$log" | tail -1)
  # On the GPU machine a skip means the device was not usable: that fails the check.
  if [[ $rc -eq 0 && $skipped -gt 0 && $CUDA == True ]]; then verdict "$part" FAIL "$skipped case(s) skipped with CUDA available: $why"
  elif [[ $rc -eq 0 && $skipped -gt 0 ]]; then verdict "$part" SKIP "$skipped case(s) skipped: $why"
  elif [[ $rc -eq 0 && $passed -gt 0 ]]; then verdict "$part" PASS "$passed case(s) ($filter)"
  else verdict "$part" FAIL "rc $rc$([[ $rc == 124 ]] && echo " (over ${limit}s)"), log $log: $(grep -m1 -E 'Failure|error|Error' "$log")"
  fi
}

check_train() {  # BINDIR
  local gmod=$1/gmod w="$LOGS/train" rc
  rm -rf "$w" && mkdir -p "$w"
  local sets=(--set model.device=cuda --set data.train="$w/data/train.json" --set checkpoint.every=2
              --set checkpoint.keep_last=0 --set parallel.timeout_s=120 --set deterministic=true)
  export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS, which deterministic=true asks for
  (cd "$root" && timeout 150 "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/ref" \
    --set resume=none) >"$w/ref.log" 2>&1 ||
    { verdict train FAIL "uninterrupted run rc $?: $(grep -m1 -i error "$w/ref.log")"; return; }
  (cd "$root" && timeout 90 "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/res" \
    --set resume=none --set schedule.exit_at_step=2) >"$w/stop.log" 2>&1 ||
    { verdict train FAIL "run stopped at step 2: rc $?: $(grep -m1 -i error "$w/stop.log")"; return; }
  (cd "$root" && timeout 90 "$gmod" train --config configs/tiny_parts.json "${sets[@]}" --set run_dir="$w/res" \
    --set resume=auto) >"$w/resume.log" 2>&1 ||
    { verdict train FAIL "resumed run rc $?: $(grep -m1 -i error "$w/resume.log")"; return; }
  grep -q "resume: " "$w/resume.log" || { verdict train FAIL "the second run did not resume (log $w/resume.log)"; return; }
  local a b
  for r in ref res; do
    (cd "$root" && "$gmod" export --checkpoint "$w/$r" --out "$w/$r-hf") >"$w/export-$r.log" 2>&1 ||
      { verdict train FAIL "export of $r: $(tail -1 "$w/export-$r.log")"; return; }
  done
  a=$(cat "$w"/ref-hf/*.safetensors | md5sum) b=$(cat "$w"/res-hf/*.safetensors | md5sum)
  local mfu
  mfu=$(grep -o '"mfu": *[0-9.e-]*' "$w/ref/metrics.jsonl" | tail -1)
  if [[ $a == "$b" ]]; then verdict train PASS "4 steps on cuda, saved, stopped at 2, resumed: weights equal ($mfu)"
  else verdict train FAIL "resumed weights differ from the uninterrupted run's"; fi
}

check_decode() {  # BIN
  local log="$LOGS/decode.log" rc
  timeout 150 "$1" --cuda --only llama --batches 1,8,32 --new 32 --reps 2 >"$log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]] && grep -q 'realised-of-achievable' "$log"; then
    verdict decode PASS "$(grep -E '^ batch|next token \(wall\)|realised-of-achievable' "$log" | tr -s ' ' | tr '\n' ';')"
  else verdict decode FAIL "rc $rc$([[ $rc == 124 ]] && echo " (over 150s)"), log $log: $(grep -m1 -iE 'error' "$log")"
  fi
}

check_train_zero3() {  # BINDIR
  local gmod=$1/gmod w="$LOGS/zero3" st
  rm -rf "$w" && mkdir -p "$w"
  local sets=(--set model.device=cuda --set data.train="$w/data/train.json" --set eval.data="$w/data/heldout.json"
              --set schedule.max_steps=2 --set metrics.log_every=1 --set parallel.timeout_s=120
              --set deterministic=true --set resume=none)
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  for st in 2 3; do
    (cd "$root" && timeout 150 "$gmod" train --config configs/demo.json "${sets[@]}" --set optimizer.zero_stage=$st \
      --set run_dir="$w/z$st") >"$w/z$st.log" 2>&1 ||
      { verdict zero3 FAIL "stage $st run rc $?: $(grep -m1 -i error "$w/z$st.log")"; return; }
  done
  grep -q "optimizer: ZeRO-3, " "$w/z3.log" || { verdict zero3 FAIL "the stage-3 run did not use ZeRO-3 (log $w/z3.log)"; return; }
  local cmp
  cmp=$("$PY" - "$w/z2/metrics.jsonl" "$w/z3/metrics.jsonl" <<'PYEOF'
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
  verdict zero3 "${cmp%% *}" "${cmp#* }"
}

main() {
  local mode=${1:-} pack bindir t0=$SECONDS
  mkdir -p "$LOGS"
  if [[ $mode == --pack ]]; then shift; pack "$@"; return; fi
  if [[ $mode == --build ]]; then
    cmake -S "$root" -B "$root/build-gpu" -G Ninja -DGMOD_PYTHON="$(command -v "$PY")" >"$LOGS/cfg.log" 2>&1 ||
      { tail -20 "$LOGS/cfg.log"; return 1; }
    cmake --build "$root/build-gpu" -j "$(nproc)" --target "${TARGETS[@]}" >"$LOGS/build.log" 2>&1 ||
      { tail -20 "$LOGS/build.log"; return 1; }
    pack=""
    bindir="$root/build-gpu"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GMOD_SOURCE_DIR="$root"
  else
    local carried=${mode:-$root/.gpu-pack}
    [[ -f $carried/pack.tar.xz ]] ||
      { echo "gpu_check: no $carried/pack.tar.xz (bench/gpu_check.sh --pack here, then carry it)"; return 1; }
    pack=${TMPDIR:-/tmp}/gmod-gpu-pack
    rm -rf "$pack" && mkdir -p "$pack" && tar -C "$pack" -xJf "$carried/pack.tar.xz" || return 1
    setup_env "$pack" || return 1
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import torch;print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())'
  CUDA=$("$PY" -c 'import torch;print(torch.cuda.is_available())' 2>/dev/null)
  local b="${bindir:-$pack/bin}"
  local tm=$b/test_mod tmo=$b/test_model mp=$b/mpi_parallel g=$b/gmod bd=$b/bench_decode
  if [[ -n ${bindir:-} ]]; then tm=$b/tests/mod/test_mod tmo=$b/tests/model/test_model mp=$b/tests/parallel/mpi_parallel g=$b/bin/gmod bd=$b/bench/bench_decode; fi
  gtest mod 120 "$tm" 'MoDCuda.*'
  gtest llava 90 "$tmo" 'HfParityCuda.*'
  gtest nccl 150 "$mp" 'ZeroNccl.*:OverlapNccl.*:Zero3Nccl.*'
  check_train "$(dirname "$g")"
  check_train_zero3 "$(dirname "$g")"
  check_decode "$bd"
  echo "---- gpu_check verdict ($((SECONDS - t0)) s)"
  printf '%s\n' "${VERDICT[@]}"
  if [[ ${#FAILED[@]} -eq 0 ]]; then echo "gpu_check: PASS"; else echo "gpu_check: FAIL (${FAILED[*]})"; return 1; fi
}

main "$@"

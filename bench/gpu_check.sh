#!/usr/bin/env bash
# One script for the lent GPU machine (one H200, torch venv, nvcc, cmake, ninja; no MPI/HDF5 unless carried):
# builds the GPU-relevant targets, runs the GPU tests and benchmarks, prints everything. Run from the repo root:
#   GMOD_PYTHON=/path/to/venv/bin/python bench/gpu_check.sh
# Needs MPI and HDF5 headers/libs for the full build; without them only model/ + mod/ targets are built.
set -uo pipefail
PY="${GMOD_PYTHON:-$(command -v python3)}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c 'import torch;print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
cmake -S . -B build-gpu -G Ninja -DGMOD_PYTHON="$PY" -DGMOD_BUILD_TESTS=ON >/tmp/gmod-gpu-cfg.log 2>&1 ||
  { tail -30 /tmp/gmod-gpu-cfg.log; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target test_model test_mod bench_mod bench_model 2>&1 | tail -5
build-gpu/tests/model/test_model --gtest_filter='HfParity*' 2>&1 | tail -8
build-gpu/tests/mod/test_mod 2>&1 | tail -3
echo "== MoD speed on GPU (bf16 would be the production dtype; bench_mod runs fp32)"
build-gpu/bench/bench_mod --cuda --hidden 2048 --layers 16 --seq 2048 --batch 4 2>&1 | tail -40
# NCCL ZeRO at 1 rank (an MPI singleton): every stage fp32 + bf16 against the reference, and the overlap hooks
# (set_last_micro_batch) launching every bucket on the comm stream during backward, bitwise equal to no overlap.
# Every NCCL collective also goes through the watchdog's event tracking (parallel/watchdog.h).
if cmake --build build-gpu -j "$(nproc)" --target mpi_parallel 2>&1 | tail -2; then
  echo "== NCCL ZeRO + overlap hooks (1 rank, fp32/bf16)"
  timeout 600 build-gpu/tests/parallel/mpi_parallel --gtest_filter='ZeroNccl.*:OverlapNccl.*' 2>&1 | tail -12
else
  echo "== NCCL ZeRO tests not built (mpi_parallel needs MPI; see above)"
fi
if [ -x build-gpu/bench/bench_parallel ] || cmake --build build-gpu --target bench_parallel >/dev/null 2>&1; then
  echo "== NCCL (1 rank)"; build-gpu/bench/bench_parallel --device cuda --dtype bf16 --params 200000000 --steps 3 2>&1 | tail -6
fi

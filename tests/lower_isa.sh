#!/bin/sh
# Runs a test command under the lower x86 instruction set (AVX2), as on a machine without AVX-512:
#   sh tests/lower_isa.sh CMD ARGS...
# oneDNN's ONEDNN_MAX_CPU_ISA=AVX2 caps the kernels oneDNN picks (and with them LibTorch's choice between oneDNN and
# its own bf16 kernels: torch.ops.mkldnn._is_mkldnn_bf16_supported() is false under it, as on an AVX2 CPU), and
# ATen's ATEN_CPU_CAPABILITY=avx2 caps ATen's vectorised kernels. Tests whose figures depend on the kernels (parity
# against references computed elsewhere, measured memory peaks, oracles with a stated tolerance) run once as the
# machine is and once through this script (ctest label `lower_isa`), so a suite green on an AVX-512 machine is
# green on an AVX2 one. On a machine that has no AVX-512 the lower set is the machine's own and the main entry
# already ran the same cases under it: exit 77, which the entries register as a skip (SKIP_RETURN_CODE).
# GMOD_LOWER_ISA_FORCE=1 runs the command anyway.
set -eu
if [ "${GMOD_LOWER_ISA_FORCE:-0}" != 1 ] && ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "lower_isa: this CPU has no AVX-512; its own set is the lower one and the main entry ran these cases"
  exit 77
fi
export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
exec "$@"

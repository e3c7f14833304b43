// `gmod info`: library versions and devices, to paste into bug reports.
#include <ATen/Context.h>
#include <mpi.h>
#include <torch/version.h>

#include <iostream>

#include "launch/args.h"
#include "model/cpu_kernels.h"
#ifdef GMOD_WITH_CUDA
#include <nccl.h>
#endif

namespace gmod::cli {
namespace {

int run_info() {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_s(mpi, len);
  if (auto nl = mpi_s.find('\n'); nl != std::string::npos) mpi_s.resize(nl);
  std::cout << "gmod " << GMOD_VERSION << "\nLibTorch " << TORCH_VERSION << "\nMPI " << mpi_s << "\n";
#ifdef GMOD_WITH_CUDA
  std::cout << "NCCL " << NCCL_MAJOR << "." << NCCL_MINOR << "." << NCCL_PATCH << " (compiled in)\n";
#else
  std::cout << "NCCL not compiled in\n";
#endif
  std::cout << "CUDA available: " << (at::hasCUDA() ? "yes" : "no") << "\n";
  // What the CPU runs (ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA lower it; tests/lower_isa.sh).
  std::cout << "CPU kernels: ATen " << cpu_capability() << ", bf16 on "
            << (cpu_bf16_uses_onednn() ? "oneDNN" : "ATen's own kernels") << "\n";
  return 0;
}

Runner setup_info(CLI::App&) { return run_info; }

Register reg_info({"info", "versions of LibTorch, MPI, NCCL and the devices seen", setup_info});

}  // namespace
}  // namespace gmod::cli

# Imported targets for LibTorch taken from the PyPI `torch` wheel in a virtualenv.
# We do not use the wheel's TorchConfig.cmake: it insists on a full CUDA toolkit whose every
# library matches (cuSPARSELt, NVSHMEM, cuFile are absent on our machines). Instead:
#   gmod::torch_cpu   libtorch_cpu + libc10 + libtorch (enough for CPU training)
#   gmod::torch_cuda  adds libtorch_cuda + libc10_cuda (linked with --no-as-needed so that
#                     ATen's CUDA hooks register) and the CUDA runtime
# Input: GMOD_PYTHON (the venv's python). Output: TORCH_ROOT, TORCH_VERSION.

if(NOT GMOD_PYTHON)
  message(FATAL_ERROR "GMOD_PYTHON is not set: pass -DGMOD_PYTHON=<venv>/bin/python (launch/setup.sh prints the venv)")
endif()
execute_process(
  COMMAND "${GMOD_PYTHON}" -c "import os,torch;print(os.path.dirname(torch.__file__));print(torch.__version__)"
  OUTPUT_VARIABLE _torch_out RESULT_VARIABLE _torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "Cannot import torch with ${GMOD_PYTHON}; run launch/setup.sh first")
endif()
string(REPLACE "\n" ";" _torch_out "${_torch_out}")
list(GET _torch_out 0 TORCH_ROOT)
list(GET _torch_out 1 TORCH_VERSION)
message(STATUS "LibTorch ${TORCH_VERSION} from ${TORCH_ROOT}")

set(_tlib "${TORCH_ROOT}/lib")
add_library(gmod_torch_cpu INTERFACE)
target_include_directories(gmod_torch_cpu SYSTEM INTERFACE
  "${TORCH_ROOT}/include" "${TORCH_ROOT}/include/torch/csrc/api/include")
target_compile_definitions(gmod_torch_cpu INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
target_link_libraries(gmod_torch_cpu INTERFACE
  "${_tlib}/libtorch.so" "${_tlib}/libtorch_cpu.so" "${_tlib}/libc10.so")
target_link_options(gmod_torch_cpu INTERFACE "LINKER:-rpath,${_tlib}")
add_library(gmod::torch_cpu ALIAS gmod_torch_cpu)

set(GMOD_HAVE_CUDA OFF)
if(GMOD_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  set(_site "${TORCH_ROOT}/..")
  find_path(GMOD_NCCL_INCLUDE nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} "${_site}/nvidia/nccl/include" NO_DEFAULT_PATH)
  find_library(GMOD_NCCL_LIB NAMES nccl libnccl.so.2
    HINTS ${CUDAToolkit_LIBRARY_DIR} "${_site}/nvidia/nccl/lib" NO_DEFAULT_PATH)
  if(CUDAToolkit_FOUND AND GMOD_NCCL_INCLUDE AND GMOD_NCCL_LIB AND EXISTS "${_tlib}/libtorch_cuda.so")
    set(GMOD_HAVE_CUDA ON)
    add_library(gmod_torch_cuda INTERFACE)
    target_link_libraries(gmod_torch_cuda INTERFACE gmod_torch_cpu CUDA::cudart
      "-Wl,--no-as-needed" "${_tlib}/libtorch_cuda.so" "${_tlib}/libc10_cuda.so" "-Wl,--as-needed"
      "${GMOD_NCCL_LIB}")
    target_include_directories(gmod_torch_cuda SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS} "${GMOD_NCCL_INCLUDE}")
    target_compile_definitions(gmod_torch_cuda INTERFACE GMOD_WITH_CUDA=1)
    add_library(gmod::torch_cuda ALIAS gmod_torch_cuda)
    message(STATUS "CUDA ${CUDAToolkit_VERSION} and NCCL (${GMOD_NCCL_LIB}): GPU code is compiled")
  else()
    message(STATUS "CUDA toolkit / NCCL / libtorch_cuda not found: GPU code is not compiled")
  endif()
endif()

# The target the project links against: CUDA-enabled when available, CPU otherwise.
add_library(gmod_torch INTERFACE)
if(GMOD_HAVE_CUDA)
  target_link_libraries(gmod_torch INTERFACE gmod_torch_cuda)
else()
  target_link_libraries(gmod_torch INTERFACE gmod_torch_cpu)
endif()
add_library(gmod::torch ALIAS gmod_torch)

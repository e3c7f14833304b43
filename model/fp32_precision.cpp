#include "model/fp32_precision.h"

#include <ATen/Context.h>

namespace gmod {

void use_ieee_fp32() {
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuBLAS(false);
  ctx.setAllowTF32CuDNN(false);
}

bool ieee_fp32_in_force() {
  const auto& ctx = at::globalContext();
  return !ctx.allowTF32CuBLAS() && !ctx.allowTF32CuDNN();
}

}  // namespace gmod

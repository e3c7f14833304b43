#include "model/patch_info_mining.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gmod {

NormLinear::NormLinear(int64_t in, int64_t out) {
  norm = register_module("0", std::make_shared<LayerNormImpl>(in, 1e-5));  // nn.LayerNorm's default eps
  linear = register_module("1", std::make_shared<LinearImpl>(in, out, /*bias=*/true));
}

PatchInfoMining::PatchInfoMining(int64_t clip_dim, int64_t aux_dim) {
  query = register_module("vlm_uni_query_projector", std::make_shared<NormLinear>(clip_dim, clip_dim));
  key = register_module("vlm_uni_aux_projector", std::make_shared<NormLinear>(aux_dim, clip_dim));
  value = register_module("vlm_uni_val_projector", std::make_shared<NormLinear>(aux_dim, clip_dim));
}

at::Tensor PatchInfoMining::forward(const at::Tensor& tokens, const at::Tensor& aux) const {
  const int64_t n = aux.size(0), C = aux.size(1);
  const auto g = static_cast<int64_t>(std::sqrt(double(tokens.size(1))));
  if (g <= 0 || aux.size(2) != aux.size(3) || aux.size(3) % g != 0 || g * g != tokens.size(1) ||
      tokens.size(0) != n)
    throw std::invalid_argument("patch info mining: tokens " + std::string(c10::str(tokens.sizes())) +
                                " do not form a square grid that divides the high-resolution map " +
                                std::string(c10::str(aux.sizes())));
  const int64_t p = aux.size(3) / g;
  auto r = aux.permute({0, 2, 3, 1}).reshape({n, g, p, g, p, C}).permute({0, 1, 3, 2, 4, 5});
  r = r.reshape({n, g * g, p * p, C}).contiguous();
  const auto q = query->forward(tokens);  // [n, T, D]
  const auto k = key->forward(r);         // [n, T, p*p, D]
  const auto v = value->forward(r);
  auto att = q.unsqueeze(2).matmul(k.transpose(-1, -2) / std::sqrt(double(k.size(-1))));  // [n, T, 1, p*p]
  att = at::nan_to_num(att);
  return att.softmax(-1).matmul(v).mean(2);
}

}  // namespace gmod

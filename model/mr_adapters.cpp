#include "model/mr_adapters.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/module_group.h"

namespace gmod {
namespace {

int64_t side_of(int64_t n, const char* what) {
  const auto s = static_cast<int64_t>(std::sqrt(double(n)));
  if (s * s != n)
    throw std::invalid_argument(std::string("LLaVA-HR adapter: ") + what + " of " + std::to_string(n) +
                                " tokens is not a square grid");
  return s;
}

std::pair<at::Tensor, at::Tensor> add_param_pair(torch::nn::Module& parent, const std::string& name,
                                                 std::vector<int64_t> wshape, int64_t bias) {
  auto g = parent.register_module(name, std::make_shared<ModuleGroup>());
  return {g->register_parameter("weight", at::zeros(wshape)),
          g->register_parameter("bias", at::zeros({bias}))};
}
}  // namespace

at::Tensor align_grid(const at::Tensor& t, int64_t dst) {
  const int64_t b = t.size(0), l = t.size(1), c = t.size(2);
  if (l == dst) return t;
  if (l % dst != 0 && dst % l != 0)
    throw std::invalid_argument("LLaVA-HR adapter: grids of " + std::to_string(l) + " and " +
                                std::to_string(dst) + " tokens do not divide one another");
  const int64_t s = side_of(l, "source"), d = side_of(dst, "target");
  auto m = t.transpose(1, 2).reshape({b, c, s, s});
  if (l < dst) {
    m = at::upsample_bilinear2d(m.to(at::kFloat), {d, d}, /*align_corners=*/true).to(t.scalar_type());
  } else {
    m = at::avg_pool2d(m, {s / d, s / d}, {s / d, s / d});
  }
  return m.reshape({b, c, -1}).transpose(1, 2);
}

StitchAdapter::StitchAdapter(int64_t d, int64_t c) {
  std::tie(slow_conv_w, slow_conv_b) = add_param_pair(*this, "slow_conv", {c, c, 1, 1}, c);
  std::tie(slow_proj_w, slow_proj_b) = add_param_pair(*this, "slow_proj", {d, c, 1, 1}, d);
  std::tie(fast_conv_w, fast_conv_b) = add_param_pair(*this, "fast_conv", {d, 1, 7, 7}, d);
  std::tie(fast_proj_w, fast_proj_b) = add_param_pair(*this, "fast_proj", {d, d, 1, 1}, d);
  auto gate = register_module("gate", std::make_shared<ModuleGroup>());
  std::tie(gate0_w, gate0_b) = add_param_pair(*gate, "0", {d / 2, 2 * d}, d / 2);
  std::tie(gate2_w, gate2_b) = add_param_pair(*gate, "2", {1, d / 2}, 1);
}

at::Tensor StitchAdapter::forward(const at::Tensor& fast, const at::Tensor& slow) const {
  const int64_t b = slow.size(0), d = fast.size(2);
  auto s = at::conv2d(at::gelu(at::conv2d(slow, slow_conv_w, slow_conv_b)), slow_proj_w, slow_proj_b);
  s = align_grid(s.reshape({b, d, -1}).transpose(1, 2), fast.size(1));  // [b, L, d]
  const int64_t g = side_of(fast.size(1), "fast grid");
  auto f = fast.transpose(1, 2).reshape({b, d, g, g});
  f = f + at::conv2d(at::gelu(at::conv2d(f, fast_conv_w, fast_conv_b, 1, 3, 1, d)), fast_proj_w, fast_proj_b);
  f = f.reshape({b, d, g * g}).transpose(1, 2);
  auto gate =
      at::linear(at::gelu(at::linear(at::cat({f, s}, -1).mean(1), gate0_w, gate0_b)), gate2_w, gate2_b);
  return f + s * gate.unsqueeze(1).tanh();
}

AlignAdapter::AlignAdapter(int64_t d, int64_t c) {
  std::tie(fast_proj_w, fast_proj_b) = add_param_pair(*this, "fast_proj", {d, d}, d);
  std::tie(slow_proj_w, slow_proj_b) = add_param_pair(*this, "slow_proj", {d, c}, d);
}

at::Tensor AlignAdapter::forward(const at::Tensor& fast, const at::Tensor& slow) const {
  const int64_t b = slow.size(0), c = slow.size(1);
  auto s = align_grid(slow.reshape({b, c, -1}).transpose(1, 2), fast.size(1));
  return at::linear(fast, fast_proj_w, fast_proj_b) + at::linear(s, slow_proj_w, slow_proj_b);
}

}  // namespace gmod

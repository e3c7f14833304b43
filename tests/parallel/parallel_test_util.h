// Shared by the parallel tests: a tiny deterministic MLP built from ATen ops, one deterministic global batch per
// step, and a reference AdamW (torch.optim.AdamW single-tensor formulas + torch clip_grad_norm_) on whole tensors.
#pragma once

#include "parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace gmod::testing {

// P = 7*4 + 7 + 3*7 + 3 = 59: not divisible by 2 or 3, so ZeRO shards are uneven (padding at the tail).
struct Mlp {
  at::Tensor w1, b1, w2, b2;

  static Mlp make(uint64_t seed, at::ScalarType dtype = at::kFloat) {
    at::manual_seed(seed);
    Mlp m;
    m.w1 = (at::randn({7, 4}) * 0.5).to(dtype).requires_grad_();
    m.b1 = (at::randn({7}) * 0.1).to(dtype).requires_grad_();
    m.w2 = (at::randn({3, 7}) * 0.5).to(dtype).requires_grad_();
    m.b2 = (at::randn({3}) * 0.1).to(dtype).requires_grad_();
    return m;
  }
  static constexpr int64_t kParams = 59;

  DataParallelOptimizer::NamedParams named() const {
    return {{"fc1.weight", w1}, {"fc1.bias", b1}, {"fc2.weight", w2}, {"fc2.bias", b2}};
  }
  std::vector<at::Tensor> tensors() const { return {w1, b1, w2, b2}; }
  // Same initial values on another device.
  Mlp to(const at::Device& d) const {
    Mlp m;
    m.w1 = w1.detach().to(d).requires_grad_();
    m.b1 = b1.detach().to(d).requires_grad_();
    m.w2 = w2.detach().to(d).requires_grad_();
    m.b2 = b2.detach().to(d).requires_grad_();
    return m;
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor h = at::tanh(at::linear(x.to(w1.options().requires_grad(false)), w1, b1));
    return at::mse_loss(at::linear(h, w2, b2).to(at::kFloat), y.to(w1.device()));
  }
  // Flat copy of all weights in fp32, on the CPU.
  at::Tensor flat() const {
    std::vector<at::Tensor> v;
    for (const auto& t : tensors()) v.push_back(t.detach().reshape({-1}).to(at::kFloat).cpu());
    return at::cat(v);
  }
};

constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3

// The global batch of step `step`: x [12, 4], y [12, 3].
inline std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  at::manual_seed(1000 + step);
  at::Tensor x = at::randn({kGlobalBatch, 4});
  at::Tensor y = at::randn({kGlobalBatch, 3});
  return {x, y};
}

// Forward+backward of this rank's slice of the global batch, in `micro` equal micro-batches (gradient
// accumulation: each micro loss is scaled by 1/micro so the local gradient is the slice mean).
inline void local_backward(const Mlp& m, int step, int rank, int world, int micro = 2) {
  auto [x, y] = global_batch(step);
  const int64_t per = kGlobalBatch / world, mb = per / micro;
  for (int i = 0; i < micro; ++i) {
    const int64_t off = rank * per + i * mb;
    (m.loss(x.narrow(0, off, mb), y.narrow(0, off, mb)) / micro).backward();
  }
}

struct RefAdamW {
  RefAdamW(AdamWHyper hyper, double max_grad_norm) : h(hyper), max_norm(max_grad_norm) {}
  AdamWHyper h;
  double max_norm = 0;
  std::vector<bool> decay;  // per tensor: torch.optim.AdamW groups with weight_decay h.weight_decay / 0 (empty: all)
  std::vector<at::Tensor> m, v;
  int64_t step = 0;

  // Returns {norm, clipped}; params are updated in place (fp32 params only).
  std::pair<double, bool> update(const std::vector<at::Tensor>& params, double lr) {
    c10::NoGradGuard ng;
    if (m.empty())
      for (const auto& p : params) {
        m.push_back(at::zeros_like(p));
        v.push_back(at::zeros_like(p));
      }
    std::vector<at::Tensor> g;
    double sq = 0;
    for (const auto& p : params) {
      g.push_back(p.grad().clone());
      const double n = at::linalg_vector_norm(g.back(), 2).item<double>();
      sq += n * n;
    }
    const double norm = std::sqrt(sq);
    bool clipped = false;
    if (max_norm > 0 && max_norm / (norm + 1e-6) < 1.0) {
      for (auto& t : g) t.mul_(max_norm / (norm + 1e-6));
      clipped = true;
    }
    ++step;
    const double bc1 = 1 - std::pow(h.beta1, double(step)), bc2 = 1 - std::pow(h.beta2, double(step));
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i].detach();
      if (decay.empty() || decay[i]) p.mul_(1 - lr * h.weight_decay);
      m[i].lerp_(g[i], 1 - h.beta1);
      v[i].mul_(h.beta2).addcmul_(g[i], g[i], 1 - h.beta2);
      at::Tensor denom = (v[i].sqrt() / std::sqrt(bc2)).add_(h.eps);
      p.addcdiv_(m[i], denom, -lr / bc1);
    }
    return {norm, clipped};
  }
};

inline void zero_grads(const Mlp& m) {
  for (auto t : m.tensors())
    if (t.grad().defined()) t.mutable_grad().zero_();
}

// max |a - b| / max |b|
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double den = b.abs().max().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / (den > 0 ? den : 1.0);
}

}  // namespace gmod::testing

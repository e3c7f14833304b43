#include "trainer/flops.h"

#include <algorithm>

#include "model/strings.h"

namespace gmod {

namespace {}  // namespace

TrainableParts TrainableParts::of(const torch::nn::Module& model, int num_layers, bool tied_head) {
  TrainableParts t;
  t.layers.assign(size_t(std::max(num_layers, 0)), false);
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const std::string& n = item.key();
    if (starts_with(n, "vision.")) t.vision = true;
    else if (starts_with(n, "projector.")) t.projector = true;
    else if (n == "llm.embed_tokens.weight") t.embedding = true;
    else if (n == "lm_head.weight") t.head = true;
    else if (starts_with(n, "llm.layers.")) {
      const size_t end = n.find('.', 11);
      const int i = std::stoi(n.substr(11, end - 11));
      if (i >= 0 && size_t(i) < t.layers.size()) t.layers[size_t(i)] = true;
    }
  }
  if (tied_head) t.head = t.embedding;
  return t;
}

TrainFlops train_flops(const ComputeReport& fwd, const TrainableParts& p) {
  TrainFlops r;
  auto both = [&r](double f) { r.flops += f, r.dense_flops += f; };
  // Multipliers on a part's forward: trainable 3, gradient flows through 2 (projections) / 3 (attention pairs), 1.
  auto linear_mult = [](bool trains, bool grad_in) { return trains ? 3.0 : grad_in ? 2.0 : 1.0; };
  auto pair_mult = [](bool trains, bool grad_in) { return trains || grad_in ? 3.0 : 1.0; };

  const bool images = fwd.images > 0;
  both(fwd.vision_flops * linear_mult(p.vision, false));
  both(fwd.projector_flops * linear_mult(p.projector, p.vision));
  bool grad = p.embedding || (images && (p.vision || p.projector));  // does the input of the next part need grad
  for (const auto& l : fwd.layers) {
    const bool trains = size_t(l.layer) < p.layers.size() && p.layers[size_t(l.layer)];
    const double lm = linear_mult(trains, grad), pm = pair_mult(trains, grad);
    r.flops += lm * l.linear_flops + pm * l.attn_flops;
    r.dense_flops += lm * l.dense_linear_flops + pm * l.dense_attn_flops;
    grad = grad || trains;
  }
  both(fwd.head_flops * linear_mult(p.head, grad));
  return r;
}

}  // namespace gmod

#include "model/activation_checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <stdexcept>
#include <unordered_set>

namespace gmod {

using torch::autograd::variable_list;

std::string ActivationCheckpointing::to_string() const {
  if (every <= 0) return "none";
  if (every == 1) return "full";
  return "every_" + std::to_string(every);
}

ActivationCheckpointing parse_activation_checkpointing(const std::string& s) {
  ActivationCheckpointing a;
  if (s == "none") return a;
  if (s == "full") {
    a.every = 1;
    return a;
  }
  const std::string prefix = "every_";
  if (s.rfind(prefix, 0) == 0) {
    const std::string k = s.substr(prefix.size());
    if (!k.empty() && k.size() <= 6 && k.find_first_not_of("0123456789") == std::string::npos) {
      a.every = std::stoi(k);
      if (a.every >= 1) return a;
    }
  }
  throw std::invalid_argument("activation checkpointing \"" + s +
                              "\": expected none, full or every_<k> with k >= 1");
}

bool can_checkpoint(const ForwardState& st) {
  return at::GradMode::is_enabled() && st.caches == nullptr && !st.want_attn_probs;
}

namespace {

// What a block reads from the caller's state, for a pass of its own (first pass or recompute); whatever the
// block writes (tokens, aux_losses, routing_scores, routing_selection) stays in this copy. A new ForwardState
// field that blocks read must be copied here.
ForwardState block_inputs(const ForwardState& st) {
  ForwardState s;
  s.rope = st.rope;
  s.positions = st.positions;
  s.key_valid = st.key_valid;
  s.token_roles = st.token_roles;
  s.host_role_counts = st.host_role_counts;
  s.cos = st.cos;
  s.sin = st.sin;
  s.mrope_positions = st.mrope_positions;  // MoD layers take the kept tokens' 3-D tables from cos/sin by it
  s.mask = st.mask;
  s.segments = st.segments;
  s.segment_index = st.segment_index;
  s.segment_slots = st.segment_slots;
  s.valid_tokens = st.valid_tokens;
  if (st.routing_scores.defined())
    s.routing_scores = st.routing_scores.detach();  // only ever used to select tokens
  return s;
}

// The autograd node of one checkpointed block: inputs (next edges) = [block input, params...], outputs =
// [block output, auxiliary losses...]. Its backward recomputes the block and returns the gradients of its
// inputs.
class CheckpointedBlockBackward final : public torch::autograd::Node {
 public:
  CheckpointedBlockBackward(std::shared_ptr<DecoderBlock> block, int layer_idx, ForwardState inputs,
                            const at::Tensor& h, const std::vector<at::Tensor>& params, size_t n_aux)
      : block_(std::move(block)),
        layer_idx_(layer_idx),
        inputs_(std::move(inputs)),
        n_aux_(n_aux),
        h_requires_grad_(h.requires_grad()),
        h_(h, /*is_output=*/false) {
    params_.reserve(params.size());
    for (const auto& p : params) params_.emplace_back(p, /*is_output=*/false);
  }

  std::string name() const override { return "CheckpointedBlockBackward"; }

  void release_variables() override {
    h_.reset_data();
    for (auto& p : params_) p.reset_data();
    inputs_ = ForwardState();
  }

  variable_list apply(variable_list&& grads) override {
    const std::string where = "activation checkpointing, layer " + std::to_string(layer_idx_);
    if (grads.size() != 1 + n_aux_)
      throw std::logic_error(where + ": got " + std::to_string(grads.size()) +
                             " output gradients, expected " + std::to_string(1 + n_aux_));
    // unpack() throws if the graph was already freed (a second backward) or a tensor was modified in place.
    const at::Tensor h = h_.unpack();
    variable_list params;
    params.reserve(params_.size());
    for (const auto& p : params_) params.push_back(p.unpack());

    at::AutoGradMode grad_mode(true);
    at::Tensor hd = h.detach();
    if (h_requires_grad_) hd.requires_grad_(true);
    ForwardState st = inputs_;
    st.routing_pass = RoutingPass::kReplay;
    const at::Tensor y = block_->forward(hd, st, layer_idx_);
    if (st.aux_losses.size() != n_aux_)
      throw std::logic_error(where + ": the recomputed forward produced " +
                             std::to_string(st.aux_losses.size()) + " auxiliary losses, the first pass " +
                             std::to_string(n_aux_));

    variable_list outs, gouts, wrt;
    auto add = [&](const at::Tensor& out, const at::Tensor& g) {
      if (!g.defined() || !out.requires_grad()) return;
      outs.push_back(out);
      gouts.push_back(g);
    };
    add(y, grads[0]);
    for (size_t i = 0; i < n_aux_; ++i) add(st.aux_losses[i], grads[1 + i]);
    if (h_requires_grad_) wrt.push_back(hd);
    wrt.insert(wrt.end(), params.begin(), params.end());

    variable_list result(1 + params.size());  // undefined = no gradient
    if (outs.empty() || wrt.empty()) return result;
    // grad() captures the gradients at the inputs without accumulating into .grad: the engine then
    // accumulates what this node returns, once per parameter.
    variable_list g = torch::autograd::grad(outs, wrt, gouts, /*retain_graph=*/false, /*create_graph=*/false,
                                            /*allow_unused=*/true);
    size_t k = 0;
    if (h_requires_grad_) result[0] = g[k++];
    for (size_t i = 0; i < params.size(); ++i) result[1 + i] = g[k++];
    return result;
  }

 private:
  std::shared_ptr<DecoderBlock> block_;
  int layer_idx_;
  ForwardState inputs_;  // what the block read, plus the first pass's routing_selection
  size_t n_aux_;
  bool h_requires_grad_;
  torch::autograd::SavedVariable h_;
  std::vector<torch::autograd::SavedVariable> params_;
};

}  // namespace

at::Tensor checkpointed_forward(const std::shared_ptr<DecoderBlock>& block, const at::Tensor& h,
                                ForwardState& st, int layer_idx) {
  if (!can_checkpoint(st)) return block->forward(h, st, layer_idx);
  std::vector<at::Tensor> params;  // trainable tensors the block uses, each once
  std::unordered_set<const void*> seen;
  auto use = [&](const at::Tensor& p) {
    if (p.defined() && p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  };
  for (const auto& p : block->parameters()) use(p);
  for (const auto& p : block->external_parameters()) use(p);
  if (!h.requires_grad() && params.empty()) return block->forward(h, st, layer_idx);

  ForwardState inputs = block_inputs(st);
  ForwardState first = inputs;
  first.routing_pass = RoutingPass::kRecord;
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = block->forward(h.detach(), first, layer_idx);
  }
  inputs.routing_selection = first.routing_selection;

  std::shared_ptr<CheckpointedBlockBackward> node(
      new CheckpointedBlockBackward(block, layer_idx, std::move(inputs), h, params, first.aux_losses.size()),
      torch::autograd::deleteNode);
  variable_list in{h};
  in.insert(in.end(), params.begin(), params.end());
  node->set_next_edges(torch::autograd::collect_next_edges(in));

  // Detached aliases (no copy) become the node's outputs, in the order apply() expects their gradients.
  at::Tensor out = y.detach();
  torch::autograd::set_history(out, node);
  for (const auto& a : first.aux_losses) {
    at::Tensor aux = a.detach();
    torch::autograd::set_history(aux, node);
    st.aux_losses.push_back(aux);
  }
  st.tokens.insert(st.tokens.end(), first.tokens.begin(), first.tokens.end());
  st.routing_scores = first.routing_scores;
  return out;
}

}  // namespace gmod

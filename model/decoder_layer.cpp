#include "model/decoder_layer.h"

#include "model/token_roles.h"

namespace gmod {

at::Tensor count_routing_roles(const at::Tensor& token_roles, const at::Tensor& key_valid, int64_t B, int64_t L) {
  auto opts = at::TensorOptions().dtype(at::kLong);
  auto dev = token_roles.defined() ? token_roles.device() : key_valid.defined() ? key_valid.device() : at::Device(at::kCPU);
  auto valid = key_valid.defined() ? key_valid.to(at::kBool) : at::ones({B, L}, opts.dtype(at::kBool).device(dev));
  auto zero = at::zeros({B}, opts.device(dev));
  at::Tensor img_sys = zero, answer = zero, image = zero;
  if (token_roles.defined()) {
    auto is = [&](TokenRole r) { return token_roles == static_cast<int64_t>(r); };
    valid = valid & is(TokenRole::kPad).logical_not();
    img_sys = (valid & (is(TokenRole::kImage) | is(TokenRole::kSystem))).sum(1);
    answer = (valid & is(TokenRole::kAnswer)).sum(1);
    image = (valid & is(TokenRole::kImage)).sum(1);
  }
  return at::stack({valid.sum(1), img_sys, answer, image}, 1).to(at::kCPU);  // [B, 4]
}

at::Tensor count_segment_roles(const at::Tensor& token_roles, const at::Tensor& key_valid, int64_t B, int64_t L,
                               const SegmentLayout& layout) {
  layout.check(B, L, "count_segment_roles");
  const auto dev = token_roles.defined() ? token_roles.device() : key_valid.defined() ? key_valid.device() : at::Device(at::kCPU);
  auto [index, slots] = layout.view_index(L, dev);
  auto valid = key_valid.defined() ? key_valid.to(at::kBool) : at::ones({B, L}, at::TensorOptions().dtype(at::kBool).device(dev));
  auto roles = token_roles.defined() ? to_segment_view(token_roles, index) : at::Tensor();
  return count_routing_roles(roles, to_segment_view(valid, index) & slots, index.size(0), index.size(1));
}

DenseDecoderLayer::DenseDecoderLayer(const LlamaConfig& c) {
  self_attn = register_module("self_attn", std::make_shared<AttentionImpl>(c));
  mlp = register_module("mlp", std::make_shared<MLPImpl>(c));
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNormImpl>(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNormImpl>(c.hidden_size, c.rms_norm_eps));
}

at::Tensor DenseDecoderLayer::forward(const at::Tensor& h, ForwardState& st, int layer_idx) {
  at::Tensor probs;
  KVCache* cache = st.caches ? &(*st.caches)[layer_idx] : nullptr;
  auto a = self_attn->forward(input_layernorm->forward(h), st.cos, st.sin, st.mask,
                              st.want_attn_probs ? &probs : nullptr, cache);
  if (st.want_attn_probs) st.attn_probs.push_back(probs);
  auto x = h + a;
  st.tokens.push_back({layer_idx, st.valid_tokens, st.valid_tokens});
  return x + mlp->forward(post_attention_layernorm->forward(x));
}

void BlockStack::push_back(std::shared_ptr<DecoderBlock> b) {
  register_module(std::to_string(blocks_.size()), b);
  blocks_.push_back(std::move(b));
}

void BlockStack::set(size_t i, std::shared_ptr<DecoderBlock> b) {
  replace_module(std::to_string(i), b);
  blocks_.at(i) = std::move(b);
}

}  // namespace gmod

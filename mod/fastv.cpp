#include "mod/fastv.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "mod/router.h"
#include "model/token_roles.h"

namespace gmod {

MoDConfig fastv_config(int k, double r, int num_layers) {
  MoDConfig c;
  c.router = RouterKind::kFastV;
  c.fastv_k = k;
  c.fastv_r = r;
  c.rope_positions = RopePositions::kOriginal;
  for (int i = std::max(k, 0); i < num_layers; ++i) c.mod_layers.push_back(i);
  c.selection = "fastv:" + std::to_string(k);
  validate(c, num_layers, "FastV K=" + std::to_string(k) + " R=" + std::to_string(r));
  return c;
}

MoDConfig parse_fastv(const std::string& spec, int num_layers) {
  const auto colon = spec.find(':');
  int k = 0;
  double r = 0.0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument(spec);
    size_t used = 0;
    const std::string ks = spec.substr(0, colon), rs = spec.substr(colon + 1);
    k = std::stoi(ks, &used);
    if (used != ks.size()) throw std::invalid_argument(ks);
    r = std::stod(rs, &used);
    if (used != rs.size()) throw std::invalid_argument(rs);
  } catch (const std::logic_error&) {
    throw std::invalid_argument("FastV \"" + spec +
                                "\": expected K:R, e.g. 2:0.5 (prune from layer K on, drop the "
                                "fraction R of the image tokens)");
  }
  return fastv_config(k, r, num_layers);
}

int64_t fastv_kept_count(int64_t n_image, double r) {
  // Python's round() on the float n·(1 - r): to nearest, ties to even (the default floating-point rounding
  // mode).
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double kept = std::nearbyint(static_cast<double>(n_image) * (1.0 - r));
  std::fesetround(saved);
  return std::min<int64_t>(n_image, std::max<int64_t>(0, static_cast<int64_t>(kept)));
}

at::Tensor fastv_last_row_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& valid) {
  at::NoGradGuard no_grad;
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3), Hkv = k.size(1);
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(q.device());
  auto vb = valid.defined() ? valid.to(at::kBool) : at::ones({B, L}, lopts.dtype(at::kBool));
  auto ar = at::arange(L, lopts).unsqueeze(0);
  auto last = at::where(vb, ar, at::full_like(ar, -1)).amax(1).clamp_min(0);            // [B] last valid row
  auto ql = q.to(at::kFloat).gather(2, last.view({B, 1, 1, 1}).expand({B, H, 1, Dh}));  // [B, H, 1, Dh]
  auto kf = k.to(at::kFloat);
  if (Hkv != H) kf = kf.repeat_interleave(H / Hkv, 1);  // GQA: query head h reads key head h / (H / Hkv)
  auto s = at::matmul(ql, kf.transpose(-1, -2)).squeeze(2) / std::sqrt(static_cast<double>(Dh));  // [B, H, L]
  auto seen = (vb & (ar <= last.unsqueeze(1))).unsqueeze(1);                                      // [B, 1, L]
  s = s.masked_fill(seen.logical_not(), -std::numeric_limits<float>::infinity());
  return at::softmax(s, -1).mean(1);  // [B, L]
}

at::Tensor fastv_selection(const at::Tensor& scores, const at::Tensor& roles, const at::Tensor& valid,
                           double r) {
  const int64_t B = scores.size(0), L = scores.size(1);
  auto vb = valid.defined() ? valid.to(at::kBool)
                            : at::ones({B, L}, at::TensorOptions().dtype(at::kBool).device(scores.device()));
  if (!roles.defined()) return vb;
  vb = vb & (roles != static_cast<int64_t>(TokenRole::kPad));
  auto image = vb & (roles == static_cast<int64_t>(TokenRole::kImage));
  auto counts = image.sum(1).cpu();  // inference only: one small host copy
  auto ca = counts.accessor<int64_t, 1>();
  std::vector<int64_t> kept(static_cast<size_t>(B));
  int64_t kmax = 0;
  for (int64_t b = 0; b < B; ++b) kmax = std::max(kmax, kept[size_t(b)] = fastv_kept_count(ca[b], r));
  auto sel = vb & image.logical_not();
  if (kmax == 0) return sel;
  // Non-image tokens rank below every image token, so each sample's first kept_b entries are image tokens.
  auto key = at::where(
      image, scores.to(at::kFloat),
      at::full_like(scores, -std::numeric_limits<float>::infinity(), at::TensorOptions().dtype(at::kFloat)));
  auto top = std::get<1>(key.topk(kmax, 1, /*largest=*/true, /*sorted=*/true));  // [B, kmax]
  auto take = at::arange(kmax, top.options()).unsqueeze(0) < at::tensor(kept, top.options()).unsqueeze(1);
  auto chosen = at::zeros({B, L}, top.options()).scatter(1, top, take.to(at::kLong)).to(at::kBool);
  return sel | (chosen & image);
}

FastVScoringLayer::FastVScoringLayer(const DenseDecoderLayer& d) {
  self_attn = register_module("self_attn", d.self_attn);
  mlp = register_module("mlp", d.mlp);
  input_layernorm = register_module("input_layernorm", d.input_layernorm);
  post_attention_layernorm = register_module("post_attention_layernorm", d.post_attention_layernorm);
}

at::Tensor FastVScoringLayer::forward(const at::Tensor& h, ForwardState& st, int layer_idx) {
  KVCache* cache = st.caches ? &(*st.caches)[layer_idx] : nullptr;
  const bool decode = cache && cache->k.defined();
  if (!decode) check_within_window(self_attn->sliding_window, h.size(1), layer_idx);
  at::Tensor probs;
  AttentionSide side;
  auto a = self_attn->forward(input_layernorm->forward(h), st.cos, st.sin, st.mask,
                              st.want_attn_probs ? &probs : nullptr, cache, decode ? nullptr : &side);
  if (st.want_attn_probs) st.attn_probs.push_back(probs);
  if (!decode) st.routing_scores = fastv_last_row_scores(side.q, side.k, st.key_valid);
  auto x = h + a;
  st.tokens.push_back({layer_idx, st.valid_tokens, st.valid_tokens});
  return x + mlp->forward(post_attention_layernorm->forward(x));
}

}  // namespace gmod

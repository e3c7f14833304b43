#include "mod/pdrop.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "mod/kept_positions.h"
#include "model/token_roles.h"

namespace gmod {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
std::string list(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

template <typename T>
std::string csv(const std::vector<T>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

template <typename T>
std::vector<T> parse_list(const std::string& s, const std::string& spec) {
  std::vector<T> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    if constexpr (std::is_same_v<T, int>) out.push_back(std::stoi(item, &used));
    else out.push_back(std::stod(item, &used));
    if (used != item.size() || item.empty()) throw std::invalid_argument(spec);
  }
  return out;
}
}  // namespace

MoDConfig pdrop_config(const std::vector<int>& layers, const std::vector<double>& ratios, int num_layers) {
  MoDConfig c;
  c.router = RouterKind::kPDrop;
  c.pdrop_layers = layers;
  c.pdrop_ratios = ratios;
  c.rope_positions = RopePositions::kCompacted;
  c.router_aux_loss_coef = 0.0;
  if (!layers.empty())
    for (int i = std::max(layers.front(), 0); i < num_layers; ++i) c.mod_layers.push_back(i);
  c.selection = "pdrop:" + csv(layers) + ":" + csv(ratios);
  validate(c, num_layers, "PyramidDrop layers " + list(layers) + " ratios " + list(ratios));
  return c;
}

MoDConfig parse_pdrop(const std::string& spec, int num_layers) {
  const auto colon = spec.find(':');
  std::vector<int> layers;
  std::vector<double> ratios;
  try {
    if (colon == std::string::npos) throw std::invalid_argument(spec);
    layers = parse_list<int>(spec.substr(0, colon), spec);
    ratios = parse_list<double>(spec.substr(colon + 1), spec);
  } catch (const std::logic_error&) {
    throw std::invalid_argument("PyramidDrop \"" + spec +
                                "\": expected LAYERS:RATIOS, e.g. 8,16,24:0.5,0.25,0.125 (stage s starts at layer "
                                "LAYERS[s] and keeps RATIOS[s] of the image tokens)");
  }
  return pdrop_config(layers, ratios, num_layers);
}

bool is_pdrop_rule(const std::string& rule) { return rule.rfind("pdrop:", 0) == 0; }

void validate_pdrop(const MoDConfig& c, int num_layers, std::ostream& err) {
  const auto& L = c.pdrop_layers;
  const auto& R = c.pdrop_ratios;
  if (L.empty()) err << "\n  router pdrop: pdrop_layers is empty (the first layer of each dropping stage)";
  if (L.size() != R.size())
    err << "\n  router pdrop: pdrop_layers " << list(L) << " and pdrop_ratios " << list(R)
        << " must have one ratio per stage (" << L.size() << " vs " << R.size() << ")";
  for (size_t i = 0; i < L.size(); ++i) {
    if (L[i] < 1 || L[i] >= num_layers)
      err << "\n  pdrop_layers[" << i << "] = " << L[i] << " outside [1, " << num_layers
          << "): a stage boundary ranks with its own layer, after at least one layer has run";
    if (i > 0 && L[i] <= L[i - 1]) err << "\n  pdrop_layers must be strictly increasing (at index " << i << ")";
  }
  for (size_t i = 0; i < R.size(); ++i) {
    if (!(R[i] >= 0.0 && R[i] <= 1.0)) err << "\n  pdrop_ratios[" << i << "] = " << R[i] << ", expected [0, 1]";
    if (i > 0 && R[i] > R[i - 1])
      err << "\n  pdrop_ratios[" << i << "] = " << R[i] << " is above pdrop_ratios[" << i - 1 << "] = " << R[i - 1]
          << ": each stage keeps a subset of the previous stage's image tokens (non-increasing ratios of the "
             "original count)";
  }
  if (!L.empty()) {
    bool tail = static_cast<int>(c.mod_layers.size()) == num_layers - L.front();
    for (size_t i = 0; tail && i < c.mod_layers.size(); ++i) tail = c.mod_layers[i] == L.front() + static_cast<int>(i);
    if (!tail)
      err << "\n  router pdrop: mod_layers_idx must be every layer from pdrop_layers[0] = " << L.front() << " to "
          << num_layers - 1;
  }
}

int64_t pdrop_kept_images(int64_t n_img, double ratio) {
  return std::min<int64_t>(n_img, static_cast<int64_t>(static_cast<double>(n_img) * ratio));
}

int pdrop_boundary(const MoDConfig& c, int layer) {
  for (size_t i = 0; i < c.pdrop_layers.size(); ++i)
    if (c.pdrop_layers[i] == layer) return static_cast<int>(i) + 1;
  return 0;
}

double pdrop_ratio(const MoDConfig& c, int layer) {
  double r = 1.0;
  for (size_t i = 0; i < c.pdrop_layers.size() && i < c.pdrop_ratios.size(); ++i)
    if (c.pdrop_layers[i] <= layer) r = c.pdrop_ratios[i];
  return r;
}

at::Tensor pdrop_queries(const at::Tensor& roles_c, const at::Tensor& valid_c, bool keep_unanswered,
                         at::Tensor* has_query) {
  const int64_t B = roles_c.size(0), K = roles_c.size(1);
  const auto answer = (roles_c == static_cast<int64_t>(TokenRole::kAnswer)) & valid_c;  // [B, K]
  auto next = at::zeros_like(answer);
  if (K > 1) next.narrow(1, 0, K - 1).copy_(answer.narrow(1, 1, K - 1));
  auto q = valid_c & answer.logical_not() & next;  // the token before each answer span
  const auto answered = q.any(1);                  // [B]
  if (!keep_unanswered) {  // no answer: the last valid slot (the last prompt token at inference)
    const auto ar = at::arange(K, at::TensorOptions().dtype(at::kLong).device(valid_c.device())).unsqueeze(0);
    const auto last = at::where(valid_c, ar, at::full_like(ar, -1)).amax(1);  // [B], -1: no valid slot
    const auto at_last = (ar == last.unsqueeze(1)) & valid_c;
    q = at::where(answered.unsqueeze(1), q, at_last);
  }
  (void)B;
  if (has_query) *has_query = q.any(1);
  return q;
}

at::Tensor pdrop_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& queries, const at::Tensor& valid,
                        int64_t qmax) {
  at::NoGradGuard no_grad;
  const int64_t B = q.size(0), H = q.size(1), K = q.size(2), Dh = q.size(3), Hkv = k.size(1);
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(q.device());
  const auto nq = queries.sum(1);                                // [B]
  if (qmax < 0) qmax = nq.numel() ? nq.max().item<int64_t>() : 0;  // host sync without the caller's count
  if (qmax == 0) return at::zeros({B, K}, q.options().dtype(at::kFloat));
  // Each sample's query slots first (ascending), as compact() orders a selection.
  const auto ar = at::arange(K, lopts).unsqueeze(0);
  const auto order = std::get<0>(at::where(queries, ar, ar + K).sort(1)).narrow(1, 0, qmax);  // [B, Q]
  const auto qpos = at::remainder(order, K);
  const auto qvalid = at::arange(qmax, lopts).unsqueeze(0) < nq.unsqueeze(1);                  // [B, Q]
  auto qf = q.to(at::kFloat).gather(2, qpos.view({B, 1, qmax, 1}).expand({B, H, qmax, Dh}));  // [B, H, Q, Dh]
  auto kf = k.to(at::kFloat);
  if (Hkv != H) kf = kf.repeat_interleave(H / Hkv, 1);  // GQA: query head h reads key head h / (H / Hkv)
  auto s = at::matmul(qf, kf.transpose(-1, -2)) / std::sqrt(static_cast<double>(Dh));  // [B, H, Q, K]
  const auto seen = valid.unsqueeze(1) & (ar.unsqueeze(1) <= qpos.unsqueeze(2));       // [B, Q, K]
  s = s.masked_fill(seen.logical_not().unsqueeze(1), kNegInf);
  auto p = at::softmax(s, -1).mean(1);                                                 // [B, Q, K]
  p = p.masked_fill(qvalid.logical_not().unsqueeze(2), 0.0);
  return p.sum(1) / nq.clamp_min(1).to(at::kFloat).unsqueeze(1);                      // [B, K]
}

at::Tensor pdrop_rank(const MoDDecoderLayer& layer, const at::Tensor& h, const ForwardState& st,
                      const at::Tensor& present, int layer_idx) {
  at::NoGradGuard no_grad;
  const auto& cfg = layer.cfg;
  const int64_t B = h.size(0), L = h.size(1);
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(h.device());
  if (!st.token_roles.defined()) return present;  // no roles: no image token known, nothing is dropped
  const auto image_full = st.token_roles == static_cast<int64_t>(TokenRole::kImage);
  // Two host synchronisations per stage boundary: these counts, then the queries' (below).
  const auto valid_full = st.key_valid.defined() ? st.key_valid.to(at::kBool) : at::ones_like(image_full);
  const auto n_present = present.sum(1);  // [B] on the device
  // present ⊇ every valid image token at stage 1; n_all: the original image count the ratio is of.
  const auto counts = at::stack({(image_full & present).sum(1), (image_full & valid_full).sum(1), n_present}).cpu();
  const auto ca = counts.accessor<int64_t, 2>();
  const double ratio = pdrop_ratio(cfg, layer_idx);
  std::vector<int64_t> keep(static_cast<size_t>(B)), ni(static_cast<size_t>(B));
  int64_t kmax = 0, present_max = 0;
  bool any_drop = false;
  for (int64_t b = 0; b < B; ++b) {
    ni[size_t(b)] = ca[0][b];
    keep[size_t(b)] = std::min(ca[0][b], pdrop_kept_images(ca[1][b], ratio));
    kmax = std::max(kmax, keep[size_t(b)]);
    present_max = std::max(present_max, ca[2][b]);
    any_drop = any_drop || keep[size_t(b)] < ca[0][b];
  }
  if (!any_drop) return present;

  // The tokens still in the sequence, compacted and renumbered as the original's re-padded sequence.
  const Compaction c = compact(present, n_present, present_max);
  const int64_t K = c.kmax;
  const auto x = gather_tokens(h.detach(), c.index);  // [B, K, D]
  const auto roles_c = st.token_roles.to(at::kLong).gather(1, c.index);
  const auto valid_c = c.valid;
  at::Tensor cos, sin;
  if (!kept_mrope_tables(st, cfg, c.index, layer_idx, cos, sin)) {  // 3-D positions: the full tables' rows
    at::Tensor pos;
    if (cfg.rope_positions == RopePositions::kCompacted) pos = at::arange(K, lopts).unsqueeze(0);
    else pos = st.positions.expand({B, L}).gather(1, c.index);
    std::tie(cos, sin) = st.rope->cos_sin(pos, h.scalar_type());
  }
  const auto qk = layer.self_attn->rotated_qk(layer.input_layernorm->forward(x), cos, sin);
  const bool keep_unanswered = cfg.pdrop_unanswered == PDropUnanswered::kKeepAll && layer.is_training();
  at::Tensor has_query;
  const auto queries = pdrop_queries(roles_c, valid_c, keep_unanswered, &has_query);
  const auto image_c = valid_c & (roles_c == static_cast<int64_t>(TokenRole::kImage));
  // A query on an image token: a sample whose image tokens have no instruction after them to be ranked by.
  const auto qcounts =
      at::stack({(queries & image_c).any(1).to(at::kLong), queries.sum(1), image_c.sum(1)}).cpu();  // [3, B]
  const auto qa = qcounts.accessor<int64_t, 2>();
  int64_t qmax = 0, image_max = 0;
  for (int64_t b = 0; b < B; ++b) qmax = std::max(qmax, qa[1][b]), image_max = std::max(image_max, qa[2][b]);
  for (int64_t b = 0; b < B; ++b)
    if (qa[0][b] && keep[size_t(b)] < ni[size_t(b)])
      throw std::invalid_argument("PyramidDrop layer " + std::to_string(layer_idx) + ": sample " + std::to_string(b) +
                                  " has no instruction token to rank its image tokens by (its query token, the last "
                                  "token before an answer or the last prompt token, is an image token)");
  const auto scores = pdrop_scores(qk.first, qk.second, queries, valid_c, qmax);  // [B, K]

  // Per ranked sample the top keep_b image tokens; a sample without a query (keep_all) keeps them all.
  auto keep_t = at::tensor(keep, lopts);
  keep_t = at::where(has_query, keep_t, image_c.sum(1));
  const int64_t top_n = std::min<int64_t>(K, std::max<int64_t>(kmax, image_max));
  auto key = at::where(image_c, scores, at::full_like(scores, kNegInf));
  auto kept_c = image_c.logical_not() & valid_c;
  if (top_n > 0) {
    const auto top = std::get<1>(key.topk(top_n, 1, /*largest=*/true, /*sorted=*/true));  // [B, top_n]
    const auto take = at::arange(top_n, lopts).unsqueeze(0) < keep_t.unsqueeze(1);
    const auto chosen = at::zeros({B, K}, lopts).scatter(1, top, take.to(at::kLong)).to(at::kBool);
    kept_c = kept_c | (chosen & image_c);
  }
  // Back to full positions: the slots' tokens that stay.
  auto out = at::zeros({B, L}, lopts).scatter(1, c.index, (kept_c & valid_c).to(at::kLong)).to(at::kBool);
  return out & present;
}

}  // namespace gmod

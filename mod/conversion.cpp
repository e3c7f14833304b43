#include "mod/conversion.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "mod/kept_positions.h"
#include "mod/method_registry.h"
#include "mod/token_selection.h"

namespace gmod {

std::string ConversionRule::to_string() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::kThreshold: os << "threshold:" << tau; break;
    case Kind::kKeepTop: os << "keep_top:" << keep_top; break;
    case Kind::kArankMod: os << "arank_mod"; break;
    case Kind::kExplicit:
      os << "layers:";
      for (size_t i = 0; i < layers.size(); ++i) os << (i ? "," : "") << layers[i];
      break;
  }
  return os.str();
}

ConversionRule parse_conversion_rule(const std::string& s) {
  ConversionRule r;
  auto colon = s.find(':');
  const std::string head = s.substr(0, colon), arg = colon == std::string::npos ? "" : s.substr(colon + 1);
  try {
    if (head == "arank_mod" && arg.empty()) {
      r.kind = ConversionRule::Kind::kArankMod;
    } else if (head == "threshold" && !arg.empty()) {
      r.kind = ConversionRule::Kind::kThreshold;
      size_t used = 0;
      r.tau = std::stod(arg, &used);
      if (used != arg.size()) throw std::invalid_argument(arg);
    } else if (head == "keep_top" && !arg.empty()) {
      r.kind = ConversionRule::Kind::kKeepTop;
      size_t used = 0;
      r.keep_top = std::stoi(arg, &used);
      if (used != arg.size() || r.keep_top < 0) throw std::invalid_argument(arg);
    } else if (head == "layers") {
      r.kind = ConversionRule::Kind::kExplicit;
      std::stringstream ss(arg);
      for (std::string item; std::getline(ss, item, ',');) {
        size_t used = 0;
        r.layers.push_back(std::stoi(item, &used));
        if (used != item.size()) throw std::invalid_argument(item);
      }
    } else {
      throw std::invalid_argument(s);
    }
  } catch (const std::logic_error&) {
    throw std::invalid_argument("conversion rule \"" + s +
                                "\": expected arank_mod, threshold:<tau>, keep_top:<k>, layers:<i,j,...>, pmod, "
                                "pmod:official_31 or pdrop:<layers>:<ratios>");
  }
  return r;
}

namespace {
// The method whose run rule `rule` is (p-MoD, PyramidDrop), or nullptr.
const TokenSelector* run_rule_method(const std::string& rule) {
  for (const TokenSelector* m : registered_methods())
    if (m->trains_by_rule(rule)) return m;
  return nullptr;
}
}  // namespace

bool rule_needs_arank(const std::string& rule) {
  if (run_rule_method(rule)) return false;
  const ConversionRule r = parse_conversion_rule(rule);
  return r.kind == ConversionRule::Kind::kThreshold || r.kind == ConversionRule::Kind::kKeepTop;
}

MoDConfig config_for_rule(const std::string& rule, const MoDConfig& base, int num_layers,
                          const std::vector<double>& arank) {
  if (!base.mod_layers.empty()) return base;
  if (const TokenSelector* m = run_rule_method(rule)) return m->run_rule_config(rule, base, num_layers);
  if (auto c = method_for(base.router).layers_from_config(base, num_layers)) return *c;
  const ConversionRule r = parse_conversion_rule(rule);
  MoDConfig c = base;
  c.mod_layers = select_mod_layers(r, num_layers, arank);
  if (c.selection.empty()) c.selection = r.to_string();
  return c;
}

std::vector<double> planned_kept_fractions(const MoDConfig& c, int num_layers, double routable) {
  const TokenSelector& method = method_for(c.router);
  std::vector<double> out;
  for (int l : c.mod_layers) {
    const std::optional<double> ratio = method.image_keep_ratio(c, l, num_layers);
    out.push_back(ratio ? 1.0 - (1.0 - *ratio) * routable : 1.0 - c.skip_frac * routable);
  }
  return out;
}

std::vector<int> select_mod_layers(const ConversionRule& rule, int n, const std::vector<double>& arank) {
  std::vector<int> out;
  auto need_arank = [&] {
    if (static_cast<int>(arank.size()) != n)
      throw std::invalid_argument("conversion rule " + rule.to_string() + ": needs one ARank per layer (" +
                                  std::to_string(n) + "), got " + std::to_string(arank.size()));
  };
  switch (rule.kind) {
    case ConversionRule::Kind::kArankMod:
      for (int i = 0; i < n; ++i)
        if (i > 2 && i != n - 1) out.push_back(i);
      break;
    case ConversionRule::Kind::kThreshold:
      need_arank();
      for (int i = 0; i < n; ++i)
        if (arank[i] < rule.tau) out.push_back(i);
      break;
    case ConversionRule::Kind::kKeepTop: {
      need_arank();
      std::vector<int> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return arank[a] > arank[b]; });
      for (int j = std::min(rule.keep_top, n); j < n; ++j) out.push_back(order[j]);
      break;
    }
    case ConversionRule::Kind::kExplicit:
      out = rule.layers;
      for (int l : out)
        if (l < 0 || l >= n)
          throw std::invalid_argument("conversion rule " + rule.to_string() + ": layer " + std::to_string(l) +
                                      " outside [0, " + std::to_string(n) + ")");
      break;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::shared_ptr<GammaRouterImpl> shared_router(const MultimodalLM& model) {
  for (const auto& child : model.named_children())
    if (child.key() == "mod_router") return std::dynamic_pointer_cast<GammaRouterImpl>(child.value());
  return nullptr;
}

std::vector<std::shared_ptr<MoDDecoderLayer>> mod_layers(const MultimodalLM& model) {
  std::vector<std::shared_ptr<MoDDecoderLayer>> out;
  const auto& stack = *model.llm->layers;
  for (size_t i = 0; i < stack.size(); ++i)
    if (auto m = std::dynamic_pointer_cast<MoDDecoderLayer>(stack[i])) out.push_back(m);
  return out;
}

void convert_to_mod(MultimodalLM& model, const MoDConfig& cfg) {
  auto& stack = *model.llm->layers;
  const int n = static_cast<int>(stack.size());
  validate(cfg, n, "convert_to_mod");
  check_rope_positions(cfg, !model.config.text.mrope_section.empty(), "convert_to_mod");
  if (!mod_layers(model).empty() || shared_router(model))
    throw std::logic_error("convert_to_mod: the model already has MoD layers");
  std::vector<std::shared_ptr<DenseDecoderLayer>> dense(n);
  for (int i = 0; i < n; ++i) {
    dense[i] = std::dynamic_pointer_cast<DenseDecoderLayer>(stack[i]);
    if (!dense[i] && cfg.is_mod_layer(i))
      throw std::logic_error("convert_to_mod: layer " + std::to_string(i) + " is not a DenseDecoderLayer");
  }
  const TokenSelector& method = method_for(cfg.router);
  std::shared_ptr<GammaRouterImpl> router;  // the model's shared router (γ-MoD), if the method has one
  if (!cfg.mod_layers.empty()) router = method.model_router(model, cfg, *dense[cfg.mod_layers.front()]);
  for (int i = 0; i < n; ++i) {
    const bool scores = method.scores_for_next(cfg, i);  // leaves attention scores for the next MoD layer
    if (cfg.is_mod_layer(i)) {
      auto layer = std::make_shared<MoDDecoderLayer>(*dense[i], cfg, router, i, scores);
      method.place(*layer, cfg, i, n);
      stack.set(i, layer);
    } else if (scores) {  // a dense scoring layer (A-MoD's before a MoD layer, FastV's at fastv_k - 1)
      if (!dense[i]) throw std::logic_error("convert_to_mod: layer " + std::to_string(i) + " is not dense");
      stack.set(i, method.scoring_layer(cfg, *dense[i]));
    }
  }
  if (!model.is_training()) model.eval();  // new modules start in training mode
}

void set_routing_mode(MultimodalLM& model, RoutingMode mode) {
  for (auto& m : mod_layers(model)) m->cfg.mode = mode;
}

at::Tensor total_routing_loss(const ForwardState& st, const MoDConfig& cfg) {
  if (st.aux_losses.empty()) return at::Tensor();
  at::Tensor sum = st.aux_losses.front();
  for (size_t i = 1; i < st.aux_losses.size(); ++i) sum = sum + st.aux_losses[i];
  return sum * cfg.router_aux_loss_coef;
}

}  // namespace gmod

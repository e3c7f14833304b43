#include "model/hf_names.h"

#include <utility>
#include <vector>

#include "model/strings.h"

namespace gmod {
namespace {

// Ordered: the first matching prefix wins, so longer, more specific prefixes come first.
const std::vector<std::pair<std::string, std::string>>& read_rules() {
  static const std::vector<std::pair<std::string, std::string>> rules = {
      {"model.language_model.", "llm."},
      // Qwen2.5-VL's vision encoder (model/qwen2_5_vl_vision.h): transformers 5's and the published names
      {"model.visual.", "vision."},
      {"visual.", "vision."},
      {"language_model.model.", "llm."},
      {"language_model.lm_head.", "lm_head."},
      {"model.multi_modal_projector.", "projector."},
      {"multi_modal_projector.", "projector."},
      {"model.mm_projector.0.", "projector.linear_1."},
      {"model.mm_projector.2.", "projector.linear_2."},
      // LLaVA-HR's multipath tower (model/multipath_tower.h)
      {"model.vision_tower.fast_vision_tower.vision_tower.vision_model.", "vision.fast_vision_tower.vision_model."},
      {"model.vision_tower.slow_vision_tower.vision_tower.", "vision.slow_vision_tower."},
      {"model.vision_tower.align_stages", "vision.align_stages"},
      // Mini-Gemini's tower (model/mgm_tower.h): CLIP as original LLaVA's (below), the OpenCLIP ConvNeXt and the
      // patch info mining projectors
      {"model.vision_tower_aux.vision_stem.", "vision.vision_tower_aux.stem."},
      {"model.vision_tower_aux.vision_stages.", "vision.vision_tower_aux.stages."},
      {"model.vlm_uni_", "vision.mining.vlm_uni_"},
      {"model.vision_tower.vision_tower.vision_model.", "vision.vision_model."},
      {"model.vision_tower.vision_model.", "vision.vision_model."},
      {"model.vision_tower.", "vision.vision_model."},
      {"vision_tower.vision_model.", "vision.vision_model."},
      {"vision_tower.", "vision.vision_model."},
      {"lm_head.", "lm_head."},
      // LLaVA-NeXT's row end: transformers 5 and the original code (`model.image_newline`), transformers 4
      {"model.image_newline", "image_newline"},
      {"image_newline", "image_newline"},
      {"model.", "llm."},
  };
  return rules;
}

const std::string kSlow = "vision.slow_vision_tower.";

// LLaVA-HR's ConvNeXt copy names the layer scale `blocks.J.weight` where timm has `blocks.J.gamma`.
std::string layer_scale_to_gamma(const std::string& g) {
  const auto b = g.rfind(".blocks.");
  if (b == std::string::npos) return g;
  const std::string tail = g.substr(b + 8);  // "J.weight" or "J.conv_dw.weight", ...
  const auto dot = tail.find('.');
  if (dot != std::string::npos && tail.substr(dot) == ".weight" &&
      tail.substr(0, dot).find_first_not_of("0123456789") == std::string::npos)
    return g.substr(0, g.size() - 6) + "gamma";
  return g;
}

}  // namespace

bool hf_unused(const std::string& hf_name) {
  if (hf_name.find("rotary_emb.inv_freq") != std::string::npos) return true;
  const auto g = hf_to_gmod(hf_name);
  // SigLIP's attention-pooling head (vision_use_head): LLaVA reads an encoder hidden state, never the pooled
  // output, so gmod does not hold it (CLIP's vision model has no `head`).
  if (g && starts_with(*g, "vision.vision_model.head.")) return true;
  return g && starts_with(*g, kSlow) &&
         (starts_with(*g, kSlow + "head.") || starts_with(*g, kSlow + "norm_pre."));
}

std::optional<std::string> hf_to_gmod(const std::string& hf_name) {
  if (hf_name.find("rotary_emb.inv_freq") != std::string::npos) return std::nullopt;
  for (const auto& [from, to] : read_rules())
    if (starts_with(hf_name, from)) {
      std::string g = to + hf_name.substr(from.size());
      return starts_with(g, kSlow) ? layer_scale_to_gamma(g) : g;
    }
  return std::nullopt;
}

std::string gmod_to_hf(const std::string& name, HfLayout layout) {
  auto swap = [&](const std::string& from, const std::string& to) -> std::optional<std::string> {
    if (starts_with(name, from)) return to + name.substr(from.size());
    return std::nullopt;
  };
  if (layout == HfLayout::kLlama) {
    if (auto s = swap("llm.", "model.")) return *s;
    return name;  // lm_head.* and anything extra keep their names
  }
  if (layout == HfLayout::kQwen3VL) {
    if (auto s = swap("vision.", "model.visual.")) return *s;
    if (auto s = swap("llm.", "model.language_model.")) return *s;
    return name;  // lm_head.*
  }
  if (layout == HfLayout::kQwen25VL) {
    if (auto s = swap("vision.", "visual.")) return *s;
    if (auto s = swap("llm.", "model.")) return *s;
    return name;  // lm_head.*
  }
  if (layout == HfLayout::kLlavaHr) {  // the original LLaVA code's layout, as LLaVA-HR and MGM save it
    if (auto s = swap("llm.", "model.")) return *s;
    if (auto s = swap("projector.linear_1.", "model.mm_projector.0.")) return *s;
    if (auto s = swap("projector.linear_2.", "model.mm_projector.2.")) return *s;
    if (auto s = swap("vision.fast_vision_tower.vision_model.",
                      "model.vision_tower.fast_vision_tower.vision_tower.vision_model."))
      return *s;
    if (auto s = swap(kSlow, "model.vision_tower.slow_vision_tower.vision_tower.")) {
      const std::string suf = ".gamma";  // the copy's layer-scale name
      if (s->size() > suf.size() && s->compare(s->size() - suf.size(), suf.size(), suf) == 0)
        return s->substr(0, s->size() - suf.size()) + ".weight";
      return *s;
    }
    if (auto s = swap("vision.align_stages", "model.vision_tower.align_stages")) return *s;
    if (auto s = swap("vision.vision_model.", "model.vision_tower.vision_tower.vision_model.")) return *s;  // MGM
    if (auto s = swap("vision.vision_tower_aux.stem.", "model.vision_tower_aux.vision_stem.")) return *s;
    if (auto s = swap("vision.vision_tower_aux.stages.", "model.vision_tower_aux.vision_stages.")) return *s;
    if (auto s = swap("vision.mining.", "model.")) return *s;
    if (name == "image_newline") return "model.image_newline";  // LLaVA-NeXT
    return name;
  }
  if (auto s = swap("llm.", "language_model.model.")) return *s;
  if (auto s = swap("lm_head.", "language_model.lm_head.")) return *s;
  if (auto s = swap("projector.", "multi_modal_projector.")) return *s;
  if (auto s = swap("vision.vision_model.", "vision_tower.vision_model.")) return *s;
  return name;
}

std::optional<int> hf_router_layer(const std::string& hf_name) {
  const auto g = hf_to_gmod(hf_name);
  static const std::string pre = "llm.layers.", suf = ".router.weight";
  if (!g || !starts_with(*g, pre) || g->size() <= pre.size() + suf.size() ||
      g->compare(g->size() - suf.size(), suf.size(), suf) != 0)
    return std::nullopt;
  const std::string idx = g->substr(pre.size(), g->size() - pre.size() - suf.size());
  if (idx.empty() || idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(idx);
}

std::string hf_router_name(int layer, HfLayout layout) {
  return gmod_to_hf("llm.layers." + std::to_string(layer) + ".router.weight", layout);
}

}  // namespace gmod

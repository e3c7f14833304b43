#include "model/hf_names.h"

#include <utility>
#include <vector>

namespace gmod {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Ordered: the first matching prefix wins, so longer, more specific prefixes come first.
const std::vector<std::pair<std::string, std::string>>& read_rules() {
  static const std::vector<std::pair<std::string, std::string>> rules = {
      {"model.language_model.", "llm."},
      {"language_model.model.", "llm."},
      {"language_model.lm_head.", "lm_head."},
      {"model.multi_modal_projector.", "projector."},
      {"multi_modal_projector.", "projector."},
      {"model.mm_projector.0.", "projector.linear_1."},
      {"model.mm_projector.2.", "projector.linear_2."},
      {"model.vision_tower.vision_tower.vision_model.", "vision.vision_model."},
      {"model.vision_tower.vision_model.", "vision.vision_model."},
      {"model.vision_tower.", "vision.vision_model."},
      {"vision_tower.vision_model.", "vision.vision_model."},
      {"vision_tower.", "vision.vision_model."},
      {"lm_head.", "lm_head."},
      {"model.", "llm."},
  };
  return rules;
}

}  // namespace

std::optional<std::string> hf_to_gmod(const std::string& hf_name) {
  if (hf_name.find("rotary_emb.inv_freq") != std::string::npos) return std::nullopt;
  for (const auto& [from, to] : read_rules())
    if (starts_with(hf_name, from)) return to + hf_name.substr(from.size());
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
  if (auto s = swap("llm.", "language_model.model.")) return *s;
  if (auto s = swap("lm_head.", "language_model.lm_head.")) return *s;
  if (auto s = swap("projector.", "multi_modal_projector.")) return *s;
  if (auto s = swap("vision.vision_model.", "vision_tower.vision_model.")) return *s;
  return name;
}

}  // namespace gmod

#pragma once
// Tower references. Original LLaVA-1.5, LLaVA-HR, Mini-Gemini and γ-MoD directories (as their code saves
// them) name their towers instead of embedding their configs: `mm_vision_tower` (the CLIP: a hub id such as
// openai/clip-vit-large-patch14-336, or a path), LLaVA-HR's `vision_tower_slow` (a timm name or a path) and
// MGM's `mm_vision_tower_aux` (a directory whose name decides the ConvNeXt). resolve_tower_refs() fills in
// what parse_model_config needs (`vision_config`, `vision_config_slow`) so such a directory loads unedited;
// the weights still come from the checkpoint, which carries the towers.
//
// The CLIP reference is looked up in this order, the first hit wins:
//   1. the explicit override (--vision-tower DIR, set_tower_overrides), a directory with a config.json;
//   2. the reference as a path relative to the model directory;
//   3. the reference as an absolute path;
//   4. the Hugging Face cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, layout
//      models--ORG--NAME/snapshots/REV (REV from refs/main, else the only snapshot);
//   5. the known architectures (known_clip_towers(): CLIP ViT-L/14-336 and ViT-L/14 by their hub ids).
// An embedded `vision_config` is kept unless an override is given. A directory's config.json may be a
// CLIPConfig (its `vision_config` is taken) or a CLIPVisionConfig. A failure lists every place looked. The
// ConvNeXt references: an override replaces the name; a name that is a directory is resolved by its
// config.json "architecture" (timm's hub layout), else by its last path component, against the known timm
// ConvNeXts (model/llava_hr_config.h, model/mgm_config.h).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gmod {

struct TowerOverrides {
  std::string vision;       // a CLIP directory (config.json), replaces mm_vision_tower's lookup
  std::string vision_slow;  // LLaVA-HR's ConvNeXt: a timm name or a directory
  std::string vision_aux;   // MGM's auxiliary ConvNeXt: a directory (its name decides) or a name
};

// Process-wide overrides (the CLI's --vision-tower, --vision-tower-slow, --vision-tower-aux).
void set_tower_overrides(const TowerOverrides& o);
const TowerOverrides& tower_overrides();

// The hub ids whose CLIP vision configs gmod knows without a directory.
std::vector<std::string> known_clip_towers();

// Fills `j` (a config.json read from `model_dir`) in place as described above; throws std::runtime_error
// naming `source`, the reference and every place looked when a CLIP reference cannot be resolved.
void resolve_tower_refs(nlohmann::json& j, const std::string& model_dir, const std::string& source,
                        const TowerOverrides& o = tower_overrides());

}  // namespace gmod

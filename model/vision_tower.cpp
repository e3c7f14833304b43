#include "model/vision_tower.h"

#include "model/clip_tower.h"
#include "model/mgm_tower.h"
#include "model/multipath_tower.h"
#include "model/qwen2_5_vl_vision.h"
#include "model/qwen3_vl_vision.h"
#include "model/siglip_tower.h"

namespace gmod {

std::shared_ptr<VisionTower> make_vision_tower(const LlavaConfig& c) {
  if (c.qwen_vision) return std::make_shared<Qwen25VisionEncoder>(*c.qwen_vision);
  if (c.qwen3_vision) return std::make_shared<Qwen3VisionEncoder>(*c.qwen3_vision);
  if (!c.vision) return nullptr;
  if (c.multipath) return std::make_shared<MultipathTower>(*c.vision, *c.multipath);
  if (c.vision->siglip())
    return std::make_shared<SiglipTower>(*c.vision, c.vision_feature_layer, c.vision_feature_select_strategy);
  if (c.mgm) return std::make_shared<MgmTower>(*c.vision, c.vision_feature_layer, *c.mgm);
  return std::make_shared<ClipTower>(*c.vision, c.vision_feature_layer, c.vision_feature_select_strategy);
}

}  // namespace gmod

#include "model/unit_hooks.h"

#include <algorithm>
#include <string>

#include "model/clip.h"
#include "model/convnext.h"
#include "model/decoder_layer.h"
#include "model/qwen2_5_vl_vision.h"
#include "model/qwen3_vl_vision.h"

namespace gmod {

at::Tensor run_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& fn) {
  UnitHooks* h = unit_hooks();
  if (!h) return fn();
  h->pre_forward(unit);
  return h->post_forward(unit, fn());
}

std::vector<std::shared_ptr<torch::nn::Module>> hooked_units(torch::nn::Module& model) {
  std::vector<std::shared_ptr<torch::nn::Module>> convnext, clip, qwen_vision, decoder;
  std::vector<std::string> taken;
  for (const auto& item : model.named_modules()) {
    const std::string& name = item.key();
    bool inside = false;
    for (const auto& t : taken) inside = inside || name.rfind(t + ".", 0) == 0;
    if (inside) continue;
    const auto& m = item.value();
    if (std::dynamic_pointer_cast<ConvNextStage>(m))
      convnext.push_back(m);
    else if (std::dynamic_pointer_cast<ClipEncoderLayer>(m))
      clip.push_back(m);
    else if (std::dynamic_pointer_cast<Qwen25VisionBlock>(m) || std::dynamic_pointer_cast<Qwen25VisionMerger>(m))
      qwen_vision.push_back(m);  // blocks, then the merger: named_modules lists them in that order
    else if (auto q3 = std::dynamic_pointer_cast<Qwen3VisionEncoder>(m)) {
      // In the order they run (ZeRO-3 gathers in forward order): each block, the DeepStack merger that reads it,
      // then the merger. named_modules lists the DeepStack mergers last.
      const auto& idx = q3->config.deepstack_visual_indexes;
      for (size_t i = 0; i < q3->blocks.size(); ++i) {
        qwen_vision.push_back(q3->blocks[i]);
        const auto at = std::find(idx.begin(), idx.end(), static_cast<int64_t>(i));
        if (at != idx.end()) qwen_vision.push_back(q3->deepstack_mergers[static_cast<size_t>(at - idx.begin())]);
      }
      qwen_vision.push_back(q3->merger);
    }
    else if (std::dynamic_pointer_cast<DecoderBlock>(m))
      decoder.push_back(m);
    else
      continue;
    taken.push_back(name);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> out = convnext;
  out.insert(out.end(), clip.begin(), clip.end());
  out.insert(out.end(), qwen_vision.begin(), qwen_vision.end());
  out.insert(out.end(), decoder.begin(), decoder.end());
  return out;
}

}  // namespace gmod

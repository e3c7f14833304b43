#include "model/unit_hooks.h"

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
    else if (std::dynamic_pointer_cast<Qwen25VisionBlock>(m) || std::dynamic_pointer_cast<Qwen25VisionMerger>(m) ||
             std::dynamic_pointer_cast<Qwen3VisionBlock>(m) || std::dynamic_pointer_cast<Qwen3VisionMerger>(m))
      qwen_vision.push_back(m);  // blocks, then the merger(s): named_modules lists them in that order
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

#include "model/convnext_weights.h"

#include <memory>
#include <set>
#include <stdexcept>

#include "model/safetensors.h"
#include "model/torch_save.h"

namespace gmod {

void load_convnext_weights(ConvNext& net, const std::string& checkpoint, const std::string& prefix) {
  // A torch.save file (e.g. open_clip's open_clip_pytorch_model.bin) or safetensors (file, directory, index).
  const bool pickled = checkpoint.size() > 4 && checkpoint.compare(checkpoint.size() - 4, 4, ".bin") == 0;
  std::unique_ptr<CheckpointFiles> st;
  std::vector<std::pair<std::string, at::Tensor>> saved;
  std::vector<std::string> names;
  if (pickled) {
    saved = read_torch_save(checkpoint);
    for (const auto& [n, t] : saved) names.push_back(n);
  } else {
    st = std::make_unique<CheckpointFiles>(checkpoint);
    names = st->names();
  }
  auto params = net.named_parameters();
  std::set<std::string> seen;
  std::vector<std::string> problems;
  at::NoGradGuard ng;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& full = names[i];
    if (full.compare(0, prefix.size(), prefix) != 0) continue;
    std::string n = full.substr(prefix.size());
    if (convnext_unused_name(n)) continue;
    // LLaVA-HR's copy of timm's ConvNeXt names the layer scale `blocks.J.weight` (timm: `blocks.J.gamma`).
    const auto b = n.rfind(".blocks.");
    if (b != std::string::npos) {
      const std::string tail = n.substr(b + 8);
      const auto dot = tail.find('.');
      if (dot != std::string::npos && tail.substr(dot) == ".weight" &&
          tail.substr(0, dot).find_first_not_of("0123456789") == std::string::npos)
        n = n.substr(0, n.size() - 6) + "gamma";
    }
    if (!params.contains(n)) {
      problems.push_back("'" + full + "' is not a tensor of this ConvNeXt (depths/dims: " +
                         std::to_string(net.config.dims.size()) + " stages, widths " +
                         std::to_string(net.config.dims.front()) + ".." +
                         std::to_string(net.config.dims.back()) + ")");
      continue;
    }
    seen.insert(n);
    try {
      copy_into(params[n], st ? st->tensor(full) : saved[i].second, full, st ? st->file_of(full) : checkpoint);
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  for (const auto& p : params)
    if (!seen.count(p.key())) problems.push_back("missing '" + prefix + p.key() + "'");
  if (!problems.empty()) {
    std::string msg = checkpoint + ": cannot load the ConvNeXt (" + std::to_string(problems.size()) +
                      " problem" + (problems.size() > 1 ? "s" : "") + "):";
    for (size_t i = 0; i < problems.size() && i < 20; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 20) msg += "\n  ... (" + std::to_string(problems.size()) + " in all)";
    throw std::runtime_error(msg);
  }
}

}  // namespace gmod

#include "model/compose.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/convnext_weights.h"
#include "model/llava_hr_config.h"
#include "model/mgm_config.h"
#include "model/mgm_tower.h"
#include "model/multipath_tower.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/strings.h"
#include "model/torch_save.h"

namespace gmod {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// "a, b, c, ... (N in all)" with at most `n` names.
std::string first_names(const std::vector<std::string>& v, size_t n = 6) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < n; ++i) s += (i ? ", " : "") + v[i];
  return v.size() > n ? s + ", ... (" + std::to_string(v.size()) + " in all)" : s;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Reads `dir`/config.json; a problem is recorded (and null returned) when it is missing or malformed.
json read_config(const std::string& what, const std::string& dir, std::vector<std::string>& problems) {
  const fs::path p = fs::path(dir) / "config.json";
  std::ifstream f(p);
  if (!f) {
    problems.push_back(what + ": " + p.string() + " does not exist");
    return json();
  }
  try {
    return json::parse(f);
  } catch (const std::exception& e) {
    problems.push_back(what + ": " + p.string() + ": malformed JSON: " + e.what());
    return json();
  }
}

// Square crop size of a CLIPImageProcessor config (int or {"height", "width"}), 0 if absent.
int preprocessor_crop(const json& j) {
  if (!j.contains("crop_size")) return 0;
  const json& c = j["crop_size"];
  if (c.is_number_integer()) return c.get<int>();
  if (c.is_object() && c.contains("height") && c["height"].is_number_integer()) return c["height"].get<int>();
  return 0;
}

// Projector name (after stripping wrappers) -> gmod name.
const std::map<std::string, std::string>& projector_names() {
  static const std::map<std::string, std::string> m = {
      {"mm_projector.0.weight", "projector.linear_1.weight"},
      {"mm_projector.0.bias", "projector.linear_1.bias"},
      {"mm_projector.2.weight", "projector.linear_2.weight"},
      {"mm_projector.2.bias", "projector.linear_2.bias"},
      {"multi_modal_projector.linear_1.weight", "projector.linear_1.weight"},
      {"multi_modal_projector.linear_1.bias", "projector.linear_1.bias"},
      {"multi_modal_projector.linear_2.weight", "projector.linear_2.weight"},
      {"multi_modal_projector.linear_2.bias", "projector.linear_2.bias"},
  };
  return m;
}

struct Composition {
  LlavaConfig config;
  std::vector<std::pair<std::string, at::Tensor>> projector;  // gmod names
  std::vector<std::string> problems;
};

Composition compose(const ModelParts& parts, bool read_projector_file) {
  Composition c;
  auto& problems = c.problems;
  if (parts.llm.empty()) problems.push_back("model.llm: required when composing a model from parts");
  else {
    const json j = read_config("model.llm", parts.llm, problems);
    if (j.is_object()) {
      if (j.contains("text_config") || j.contains("mm_vision_tower") || j.contains("vision_config"))
        problems.push_back("model.llm: " + parts.llm +
                           " holds a multimodal (LLaVA) config; give a LlamaForCausalLM directory, or use model.path "
                           "for a combined checkpoint");
      else c.config.text = parse_llama_config(j, "model.llm: " + parts.llm + "/config.json: ", problems);
    }
  }
  c.config.image_token_id = c.config.text.vocab_size;
  c.config.vision_feature_layer = parts.vision_feature_layer;
  c.config.vision_feature_select_strategy = parts.vision_feature_select_strategy;
  if (!parts.vision.empty()) {
    const json j = read_config("model.vision", parts.vision, problems);
    const std::string where = "model.vision: " + parts.vision + "/config.json: ";
    if (j.is_object()) {
      if (j.contains("vision_config") && j["vision_config"].is_object())  // CLIPModel
        c.config.vision = parse_clip_vision_config(j["vision_config"], where + "vision_config: ", problems);
      else if (j.value("model_type", std::string("clip_vision_model")) == "clip_vision_model")
        c.config.vision = parse_clip_vision_config(j, where, problems);
      else
        problems.push_back(where + "model_type '" + j.value("model_type", std::string()) +
                           "' is not a CLIP vision model (clip_vision_model or clip)");
    }
    if (c.config.vision) {
      const int n = c.config.vision->num_hidden_layers, l = parts.vision_feature_layer;
      if (l < -(n + 1) || l > n)
        problems.push_back("model.vision_feature_layer " + std::to_string(l) + " is out of range for a tower of " +
                           std::to_string(n) + " layers");
      const fs::path pre = fs::path(parts.vision) / "preprocessor_config.json";
      if (fs::exists(pre)) {
        try {
          const int crop = preprocessor_crop(json::parse(std::ifstream(pre)));
          if (crop > 0 && crop != c.config.vision->image_size)
            problems.push_back("model.vision: " + pre.string() + " crops images to " + std::to_string(crop) +
                               " px but the tower's image_size is " + std::to_string(c.config.vision->image_size));
        } catch (const std::exception& e) {
          problems.push_back("model.vision: " + pre.string() + ": malformed JSON: " + e.what());
        }
      }
    }
    if (parts.vision_feature_select_strategy != "default" && parts.vision_feature_select_strategy != "full")
      problems.push_back("model.vision_feature_select_strategy must be 'default' or 'full', got '" +
                         parts.vision_feature_select_strategy + "'");
    if (!parts.vision_slow.empty()) {  // LLaVA-HR: `vision` is the fast path, this the ConvNeXt
      const json s = read_config("model.vision_slow", parts.vision_slow, problems);
      json hr = {{"input_image_size", parts.input_image_size}, {"freeze_vision", parts.freeze_vision}};
      if (s.is_object()) {
        const bool named = s.contains("architecture") && s["architecture"].is_string();
        hr["vision_tower_slow"] = named ? s["architecture"].get<std::string>() : "convnext_large_mlp";
        if (!named)
          problems.push_back("model.vision_slow: " + parts.vision_slow + "/config.json has no 'architecture' (a timm "
                             "model directory names its model there, e.g. convnext_large_mlp)");
        if (s.contains("model_args") && s["model_args"].is_object()) hr["vision_config_slow"] = s["model_args"];
      }
      if (s.is_object())
        parse_llava_hr_fields(hr, "model.vision_slow: " + parts.vision_slow + "/config.json: ", c.config, problems);
    }
    if (!parts.vision_aux.empty()) {  // MGM: `vision` is the low-resolution CLIP, this the ConvNeXt
      if (!parts.vision_slow.empty())
        problems.push_back("model.vision_slow and model.vision_aux are both given (LLaVA-HR's or MGM's tower?)");
      const std::string where = "model.vision_aux: " + parts.vision_aux + ": ";
      const fs::path oc = fs::path(parts.vision_aux) / "open_clip_config.json";
      json mgm = {{"mm_vision_tower_aux", parts.vision_aux},
                  {"image_size_aux", parts.image_size_aux},
                  {"image_grid", parts.image_grid},
                  {"image_global", parts.image_global},
                  {"optimize_vision_tower", parts.optimize_vision_tower},
                  {"optimize_vision_tower_aux", parts.optimize_vision_tower_aux}};
      if (!fs::exists(oc)) {
        problems.push_back(where + "no open_clip_config.json (an OpenCLIP model directory, e.g. "
                           "laion/CLIP-convnext_large_d_320.laion2B-s29B-b131K-ft-soup)");
      } else {
        try {
          const json o = json::parse(std::ifstream(oc));
          if (o.contains("vision_config_aux")) mgm["vision_config_aux"] = o["vision_config_aux"];  // tiny test towers
        } catch (const std::exception& e) {
          problems.push_back(where + "open_clip_config.json: malformed JSON: " + e.what());
        }
      }
      if (c.config.vision_feature_select_strategy != "default")
        problems.push_back("model.vision_feature_select_strategy must be 'default' for MGM (patch tokens only)");
      else
        parse_mgm_fields(mgm, where, c.config, problems);
    }
    if (!parts.image_grid_pinpoints.empty()) {  // LLaVA-NeXT: AnyRes tiles of the CLIP tower's input
      if (c.config.multipath || c.config.mgm)
        problems.push_back("model.image_grid_pinpoints: AnyRes tiles a single CLIP tower's input, not LLaVA-HR's or "
                           "MGM's towers");
      const int tile = c.config.vision ? c.config.vision->image_size : 0;
      for (const auto& hw : parts.image_grid_pinpoints)
        if (tile > 0 && (hw[0] <= 0 || hw[1] <= 0 || hw[0] % tile || hw[1] % tile))
          problems.push_back("model.image_grid_pinpoints: [" + std::to_string(hw[0]) + ", " + std::to_string(hw[1]) +
                             "] is not a whole grid of the tower's " + std::to_string(tile) + " px tiles");
      AnyresConfig a;
      a.pinpoints = parts.image_grid_pinpoints;
      a.unpad_truncates = true;  // the original LLaVA code's spatial_unpad
      c.config.anyres = a;
    }
  } else if (!parts.image_grid_pinpoints.empty()) {
    problems.push_back("model.image_grid_pinpoints is given but model.vision is not (AnyRes tiles a tower's input)");
  } else if (!parts.vision_slow.empty() || !parts.vision_aux.empty()) {
    problems.push_back("model.vision_slow / model.vision_aux is given but model.vision is not (LLaVA-HR's fast "
                       "path and MGM's low-resolution path are CLIP towers)");
  } else if (!parts.projector.empty()) {
    problems.push_back("model.projector is given but model.vision is not (a projector needs a vision tower)");
  }
  if (!parts.projector.empty() && read_projector_file) {
    c.projector = read_projector(parts.projector, problems);
    const int64_t dv = c.config.vision ? c.config.vision->hidden_size : -1, dt = c.config.text.hidden_size;
    for (const auto& [name, t] : c.projector) {
      if (starts_with(name, "vision.mining.")) {  // MGM's mining projectors: checked when copied
        if (!c.config.mgm)
          problems.push_back("model.projector: " + parts.projector + ": '" + name +
                             "' is an MGM mining projector, but the model has no MGM tower (model.vision_aux)");
        continue;
      }
      if (starts_with(name, "vision.")) {  // LLaVA-HR adapters: checked when copied into the tower
        if (!c.config.multipath)
          problems.push_back("model.projector: " + parts.projector + ": '" + name +
                             "' is a LLaVA-HR adapter, but the model has no multipath tower (model.vision_slow)");
        continue;
      }
      std::vector<int64_t> want;
      if (name == "projector.linear_1.weight") want = {dt, dv};
      else if (name == "projector.linear_2.weight") want = {dt, dt};
      else want = {dt};
      if (dv > 0 && t.sizes() != at::IntArrayRef(want))
        problems.push_back("model.projector: " + parts.projector + ": '" + name + "' has shape " +
                           shape_str(t.sizes()) + " but the vision tower (hidden " + std::to_string(dv) +
                           ") and the LLM (hidden " + std::to_string(dt) + ") need " + shape_str(want));
    }
  }
  return c;
}

[[noreturn]] void throw_problems(const std::vector<std::string>& problems) {
  std::ostringstream os;
  os << "cannot compose the model from its parts (" << problems.size() << " problem"
     << (problems.size() > 1 ? "s" : "") << "):";
  for (const auto& p : problems) os << "\n  " << p;
  throw std::runtime_error(os.str());
}

// The vision tower's tensors of a CLIPVisionModel/CLIPModel directory under gmod names (vision.vision_model.*);
// the text tower and projections of a CLIPModel are skipped.
void load_vision(MultimodalLM& model, const std::string& dir, const std::string& prefix,
                 std::vector<std::string>& problems) {
  // safetensors or pytorch_model.bin (single or sharded), as the tower's own save wrote it.
  std::unique_ptr<CheckpointFiles> st;
  try {
    st = std::make_unique<CheckpointFiles>(dir);
  } catch (const std::exception& e) {
    problems.push_back(std::string("model.vision: ") + e.what());
    return;
  }
  const std::vector<std::string> names = st->names();
  auto params = model.named_parameters(true);
  std::set<std::string> seen;
  std::vector<std::string> unknown;
  at::NoGradGuard ng;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (starts_with(n, "text_model.") || starts_with(n, "visual_projection.") || starts_with(n, "text_projection.") ||
        n == "logit_scale" || n.find("position_ids") != std::string::npos)
      continue;
    // CLIPModel and older CLIPVisionModel saves prefix the tower with "vision_model."; transformers 5 saves a
    // CLIPVisionModel without it.
    const std::string g = starts_with(n, "vision_model.") ? prefix + n : prefix + "vision_model." + n;
    if (!params.contains(g)) {
      unknown.push_back(n);
      continue;
    }
    seen.insert(g);
    try {
      copy_into(params[g], st->tensor(n), n, st->file_of(n));
    } catch (const std::exception& e) {
      problems.push_back(std::string("model.vision: ") + e.what());
    }
  }
  if (!unknown.empty())
    problems.push_back("model.vision: " + dir + ": tensors a CLIP vision tower does not have: " + first_names(unknown));
  std::vector<std::string> missing;
  for (const auto& p : params)  // the CLIP's own tensors (MGM's tower holds more under the same prefix)
    if (starts_with(p.key(), prefix + "vision_model.") && !seen.count(p.key()))
      missing.push_back(p.key().substr(prefix.size()));
  if (!missing.empty())
    problems.push_back("model.vision: " + dir + " lacks " + std::to_string(missing.size()) +
                       " tensor(s): " + first_names(missing));
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> read_projector(const std::string& path,
                                                               std::vector<std::string>& problems) {
  std::vector<std::pair<std::string, at::Tensor>> raw;
  try {
    if (fs::path(path).extension() == ".safetensors") {
      CheckpointFiles ck(path);
      for (const auto& n : ck.names()) raw.emplace_back(n, ck.tensor(n).clone());
    } else {
      raw = read_torch_save(path);
    }
  } catch (const std::exception& e) {
    problems.push_back(std::string("model.projector: ") + e.what());
    return {};
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::set<std::string> got;
  std::vector<std::string> unknown;
  for (auto& [name, t] : raw) {
    std::string n = name;
    for (const char* wrap : {"base_model.model.", "model."})  // LoRA wrapper, LlavaLlamaModel
      if (starts_with(n, wrap)) n = n.substr(std::string(wrap).size());
    if (starts_with(n, "vlm_uni_")) {  // MGM's stage 1 saves its mining projectors alongside
      const std::string g = "vision.mining." + n;
      if (got.insert(g).second) out.emplace_back(g, t);
      continue;
    }
    // MGM's stage 1 also saves its (frozen) towers; gmod takes them from their own directories.
    if (starts_with(n, "vision_tower_aux.") || starts_with(n, "vision_tower.vision_tower.")) continue;
    if (starts_with(n, "vision_tower.align_stages")) {  // LLaVA-HR's stage 1 saves its adapters alongside
      const std::string g = "vision." + n.substr(13);
      if (got.insert(g).second) out.emplace_back(g, t);
      continue;
    }
    auto it = projector_names().find(n);
    if (it == projector_names().end()) {
      unknown.push_back(name);
      continue;
    }
    if (!got.insert(it->second).second) {
      problems.push_back("model.projector: " + path + ": '" + name + "' gives " + it->second + " a second time");
      continue;
    }
    out.emplace_back(it->second, t);
  }
  for (const auto& u : unknown)
    problems.push_back("model.projector: " + path + ": unknown tensor '" + u +
                       "' (expected model.mm_projector.{0,2}.{weight,bias} or "
                       "multi_modal_projector.linear_{1,2}.{weight,bias}; only mlp2x_gelu projectors are supported)");
  for (const char* need : {"projector.linear_1.weight", "projector.linear_1.bias", "projector.linear_2.weight",
                           "projector.linear_2.bias"})
    if (!got.count(need))
      problems.push_back("model.projector: " + path + " lacks " + need);
  return out;
}

LlavaConfig compose_model_config(const ModelParts& parts) {
  Composition c = compose(parts, /*read_projector_file=*/false);
  if (!c.problems.empty()) throw_problems(c.problems);
  return c.config;
}

std::shared_ptr<MultimodalLM> load_composed(const ModelParts& parts, at::ScalarType dtype, at::Device device,
                                            uint64_t init_seed) {
  Composition c = compose(parts, /*read_projector_file=*/true);
  if (!c.problems.empty()) throw_problems(c.problems);  // configs must be right before anything is allocated
  auto model = std::make_shared<MultimodalLM>(c.config);
  if (c.projector.empty() && c.config.vision) model->init_weights(init_seed, "projector.");
  if (c.config.anyres) model->init_weights(init_seed, "image_newline");  // LLaVA-NeXT's row end starts random
  // LLaVA-HR's adapters: those the stage-1 file lacks start as the original initialises them (a frozen-tower stage 1
  // saves the align module but no stitches; LLaVA-HR loads it with strict=False).
  std::set<std::string> adapter_groups;  // "vision.align_stages." / "vision.align_stages_latent." given by the file
  for (const auto& [name, t] : c.projector)
    if (starts_with(name, "vision.align_stages")) adapter_groups.insert(name.substr(0, name.find('.', 7) + 1));
  if (c.config.multipath)
    for (const char* group : {"vision.align_stages.", "vision.align_stages_latent."})
      if (!adapter_groups.count(group)) model->init_weights(init_seed, group);
  // MGM's mining projectors: built fresh (nn.LayerNorm / nn.Linear defaults) when the stage-1 file lacks them.
  const bool has_mining = std::any_of(c.projector.begin(), c.projector.end(),
                                      [](const auto& x) { return starts_with(x.first, "vision.mining."); });
  if (c.config.mgm && !has_mining) model->init_weights(init_seed, "vision.mining.");
  if (has_mining) adapter_groups.insert("vision.mining.");
  model->to(device, dtype);
  std::vector<std::string>& problems = c.problems;
  try {
    LoadOptions o;
    o.optional_prefixes = {"vision.", "projector.", "image_newline"};
    load_weights(*model, parts.llm, o);
  } catch (const std::exception& e) {
    problems.push_back(std::string("model.llm: ") + e.what());
  }
  if (!parts.vision.empty())
    load_vision(*model, parts.vision, c.config.multipath ? "vision.fast_vision_tower." : "vision.", problems);
  if (c.config.mgm) {  // open_clip's state dict: the timm trunk under visual.trunk.
    const fs::path d(parts.vision_aux);
    // open_clip_model.safetensors, else a torch.save .bin holding a plain dict (LibTorch cannot unpickle the
    // OrderedDict of a state_dict(); such a file needs converting, docs/models.md).
    const fs::path file = fs::exists(d / "open_clip_model.safetensors") ? d / "open_clip_model.safetensors"
                                                                         : d / "open_clip_pytorch_model.bin";
    try {
      load_convnext_weights(*std::dynamic_pointer_cast<MgmTower>(model->vision)->convnext, file.string(),
                            "visual.trunk.");
    } catch (const std::exception& e) {
      problems.push_back(std::string("model.vision_aux: ") + e.what());
    }
  }
  if (c.config.multipath) {
    try {
      load_convnext_weights(*std::dynamic_pointer_cast<MultipathTower>(model->vision)->convnext, parts.vision_slow);
    } catch (const std::exception& e) {
      problems.push_back(std::string("model.vision_slow: ") + e.what());
    }
  }
  if (!c.projector.empty()) {
    auto params = model->named_parameters(true);
    at::NoGradGuard ng;
    std::vector<std::string> adapters_missing;  // a group the file gives must be complete
    for (const auto& p : params)
      if (adapter_groups.count(p.key().substr(0, p.key().find('.', 7) + 1)) &&
          std::none_of(c.projector.begin(), c.projector.end(), [&](const auto& x) { return x.first == p.key(); }))
        adapters_missing.push_back(p.key());
    if (!adapters_missing.empty())
      problems.push_back("model.projector: " + parts.projector +
                         " holds LLaVA-HR adapters or MGM projectors but lacks " +
                         first_names(adapters_missing));
    for (auto& [name, t] : c.projector) {
      if (!params.contains(name)) {
        problems.push_back("model.projector: " + parts.projector + ": '" + name + "' is not a tensor of this model");
        continue;
      }
      try {
        copy_into(params[name], t, name, parts.projector);
      } catch (const std::exception& e) {
        problems.push_back(std::string("model.projector: ") + e.what());
      }
    }
  }
  if (!problems.empty()) throw_problems(problems);
  return model;
}

std::string parts_preprocessor_dir(const ModelParts& parts) { return parts.vision; }

}  // namespace gmod

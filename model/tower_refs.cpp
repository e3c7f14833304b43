#include "model/tower_refs.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "model/llava_hr_config.h"

namespace gmod {
namespace fs = std::filesystem;

namespace {

TowerOverrides& overrides() {
  static TowerOverrides o;
  return o;
}

// transformers' CLIPVisionConfig defaults: what a config.json that omits a field means.
nlohmann::json clip_vision_defaults() {
  return {{"model_type", "clip_vision_model"},
          {"hidden_size", 768},
          {"intermediate_size", 3072},
          {"num_hidden_layers", 12},
          {"num_attention_heads", 12},
          {"num_channels", 3},
          {"image_size", 224},
          {"patch_size", 32},
          {"hidden_act", "quick_gelu"},
          {"layer_norm_eps", 1e-5},
          {"initializer_range", 0.02}};
}

// The published CLIP ViT-L/14 towers LLaVA-family models name (OpenAI's configs: 24 layers of width 1024,
// 16 heads, MLP 4096, patch 14, quick_gelu).
nlohmann::json known_clip(const std::string& id) {
  auto j = clip_vision_defaults();
  j.update({{"hidden_size", 1024},
            {"intermediate_size", 4096},
            {"num_hidden_layers", 24},
            {"num_attention_heads", 16},
            {"patch_size", 14},
            {"projection_dim", 768}});
  if (id == "openai/clip-vit-large-patch14-336")
    j["image_size"] = 336;
  else if (id == "openai/clip-vit-large-patch14")
    j["image_size"] = 224;
  else
    return nullptr;
  return j;
}

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": cannot open");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(p.string() + ": malformed JSON: " + e.what());
  }
}

// A CLIP directory's vision config (CLIPConfig's vision_config, or a CLIPVisionConfig), defaults filled in.
nlohmann::json clip_vision_of(const fs::path& dir) {
  const auto j = read_json_file(dir / "config.json");
  const nlohmann::json& v =
      j.contains("vision_config") && j["vision_config"].is_object() ? j["vision_config"] : j;
  auto out = clip_vision_defaults();
  for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = it.value();
  return out;
}

std::string hf_hub_cache() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return (fs::path(h) / "hub").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "huggingface" / "hub").string();
  return "";
}

// models--ORG--NAME/snapshots/REV for hub id ORG/NAME: REV from refs/main, else the only snapshot.
std::string hub_snapshot(const std::string& cache, const std::string& id, std::string& looked) {
  if (cache.empty() || id.find('/') == std::string::npos || id.front() == '/') {
    looked = "the Hugging Face cache (not a hub id, or no cache directory)";
    return "";
  }
  std::string flat = "models--" + id;
  for (size_t i = 0; (i = flat.find('/', i)) != std::string::npos;) flat.replace(i, 1, "--");
  const fs::path repo = fs::path(cache) / flat;
  looked = (repo / "snapshots").string() + " (Hugging Face cache)";
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) return "";
  if (std::ifstream ref(repo / "refs" / "main"); ref) {
    std::string rev;
    std::getline(ref, rev);
    if (!rev.empty() && fs::exists(repo / "snapshots" / rev / "config.json", ec))
      return (repo / "snapshots" / rev).string();
  }
  std::vector<fs::path> snaps;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
    if (fs::exists(e.path() / "config.json", ec)) snaps.push_back(e.path());
  if (snaps.size() == 1) return snaps.front().string();
  if (snaps.size() > 1) looked += ": several snapshots and no refs/main";
  return "";
}

void resolve_clip(nlohmann::json& j, const std::string& model_dir, const std::string& source,
                  const TowerOverrides& o) {
  const bool embedded = j.contains("vision_config") && j["vision_config"].is_object();
  if (embedded && o.vision.empty()) return;
  if (!j.contains("mm_vision_tower") && o.vision.empty()) return;
  const std::string ref = j.contains("mm_vision_tower") && j["mm_vision_tower"].is_string()
                              ? j["mm_vision_tower"].get<std::string>()
                              : "";
  std::vector<std::string> looked;
  auto try_dir = [&](const fs::path& d, const std::string& what) {
    std::error_code ec;
    looked.push_back(d.string() + " (" + what + ")");
    if (!fs::exists(d / "config.json", ec)) return false;
    j["vision_config"] = clip_vision_of(d);
    return true;
  };
  if (!o.vision.empty()) {
    if (try_dir(o.vision, "--vision-tower")) return;
    throw std::runtime_error(source + ": --vision-tower " + o.vision + " holds no config.json");
  }
  if (ref.empty()) {
    throw std::runtime_error(source +
                             ": 'mm_vision_tower' must name the CLIP tower (a hub id or a path), got " +
                             j["mm_vision_tower"].dump());
  }
  const fs::path rp(ref);
  if (rp.is_relative() && !model_dir.empty() && try_dir(fs::path(model_dir) / rp, "relative to the model"))
    return;
  if (rp.is_absolute() && try_dir(rp, "absolute path")) return;
  std::string hub_looked;
  if (const std::string snap = hub_snapshot(hf_hub_cache(), ref, hub_looked); !snap.empty()) {
    j["vision_config"] = clip_vision_of(snap);
    return;
  }
  looked.push_back(hub_looked);
  if (auto k = known_clip(ref); !k.is_null()) {
    j["vision_config"] = k;
    return;
  }
  std::string known;
  for (const auto& id : known_clip_towers()) known += (known.empty() ? "" : ", ") + id;
  looked.push_back("the known architectures (" + known + ")");
  std::string msg = source + ": cannot find the CLIP tower '" + ref + "' (mm_vision_tower); looked at:";
  for (const auto& l : looked) msg += "\n  " + l;
  throw std::runtime_error(msg +
                           "\n  give its directory with --vision-tower DIR, or embed its 'vision_config'");
}

std::string last_path_component(const std::string& s) {
  const auto p = fs::path(s);
  return p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
}

// LLaVA-HR's vision_tower_slow: a directory (timm's hub layout: config.json "architecture") or a path whose
// last component is the timm name; the shape is embedded as vision_config_slow, the name kept.
void resolve_slow(nlohmann::json& j, const std::string& model_dir, const TowerOverrides& o) {
  if (!o.vision_slow.empty()) j["vision_tower_slow"] = o.vision_slow;
  if (!j.contains("vision_tower_slow") || !j["vision_tower_slow"].is_string()) return;
  if (j.contains("vision_config_slow") && !j["vision_config_slow"].is_null()) return;
  const std::string name = j["vision_tower_slow"].get<std::string>();
  if (convnext_preset(name)) return;  // a timm name: parse_llava_hr_fields knows it
  std::error_code ec;
  std::vector<fs::path> dirs{fs::path(name)};  // relative to the model directory first, then as given
  if (fs::path(name).is_relative() && !model_dir.empty())
    dirs.insert(dirs.begin(), fs::path(model_dir) / name);
  for (const auto& d : dirs) {
    if (!fs::exists(d / "config.json", ec)) continue;
    const auto c = read_json_file(d / "config.json");
    if (!c.contains("architecture") || !c["architecture"].is_string()) continue;
    if (auto p = convnext_preset(c["architecture"].get<std::string>())) {
      auto shape = convnext_shape_to_json(*p);  // timm's model_args override the architecture's defaults
      if (c.contains("model_args") && c["model_args"].is_object()) shape.update(c["model_args"]);
      j["vision_config_slow"] = shape;
      return;
    }
  }
  if (auto p = convnext_preset(last_path_component(name)))
    j["vision_config_slow"] = convnext_shape_to_json(*p);
}

}  // namespace

void set_tower_overrides(const TowerOverrides& o) { overrides() = o; }
const TowerOverrides& tower_overrides() { return overrides(); }

std::vector<std::string> known_clip_towers() {
  return {"openai/clip-vit-large-patch14-336", "openai/clip-vit-large-patch14"};
}

void resolve_tower_refs(nlohmann::json& j, const std::string& model_dir, const std::string& source,
                        const TowerOverrides& o) {
  if (!j.is_object() || j.contains("text_config")) return;  // transformers' LLaVA embeds its towers
  resolve_clip(j, model_dir, source, o);
  const auto mp = j.find("is_multipath_encoder");
  if (mp != j.end() && mp->is_boolean() && mp->get<bool>()) resolve_slow(j, model_dir, o);
  if (!o.vision_aux.empty() && j.contains("mm_vision_tower_aux")) j["mm_vision_tower_aux"] = o.vision_aux;
}

}  // namespace gmod

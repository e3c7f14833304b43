#include "trainer/config/param_groups.h"

#include <fnmatch.h>

#include <cmath>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model/strings.h"
#include "trainer/config/config_json.h"
#include "trainer/config/train_config.h"

namespace gmod {
namespace {

using json = nlohmann::json;
using config_json::num;

std::string group_name(const ParamGroupConfig& g, size_t i) {
  return g.name.empty() ? "group" + std::to_string(i) : g.name;
}

// A group's selection compiled once: its parts, globs and regexes.
struct Matcher {
  std::set<std::string> parts;
  std::vector<std::string> globs;
  std::vector<std::regex> regexes;
  bool operator()(const std::string& name, const std::string& part) const {
    if (parts.count(part)) return true;
    for (const auto& g : globs)
      if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
    for (const auto& r : regexes)
      if (std::regex_search(name, r)) return true;
    return false;
  }
};

}  // namespace

const std::vector<std::string>& param_parts() {
  static const std::vector<std::string> parts{"projector", "vision_tower", "vision_adapters",
                                              "llm",       "routers",      "lora"};
  return parts;
}

std::string param_part(const std::string& name, bool vision_adapter) {
  if (name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos) return "lora";
  if (starts_with(name, "vision.")) return vision_adapter ? "vision_adapters" : "vision_tower";
  if (starts_with(name, "projector.")) return "projector";
  if (starts_with(name, "mod_router.") ||
      (starts_with(name, "llm.layers.") && name.find(".router.") != std::string::npos))
    return "routers";
  return "llm";
}

std::vector<ParamGroupConfig> param_groups_from_json(const json& v, const std::string& key,
                                                     std::vector<std::string>& errs) {
  std::vector<ParamGroupConfig> out;
  if (!v.is_array()) {
    errs.push_back(key + ": expected an array of groups, got " + v.type_name());
    return out;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string k = key + "[" + std::to_string(i) + "]";
    ParamGroupConfig g;
    const json& o = v[i];
    if (!o.is_object()) {
      errs.push_back(k +
                     ": expected an object {\"name\", \"parts\", \"params\", \"params_regex\", \"lr\", "
                     "\"weight_decay\", \"freeze\"}, got " +
                     std::string(o.type_name()));
      out.push_back(g);
      continue;
    }
    auto strings = [&](const json& a, const std::string& f, std::vector<std::string>& dst) {
      if (!a.is_array())
        return errs.push_back(k + "." + f + ": expected an array of strings, got " + a.dump());
      for (const auto& s : a) {
        if (!s.is_string())
          return errs.push_back(k + "." + f + ": expected an array of strings, got " + a.dump());
        dst.push_back(s.get<std::string>());
      }
    };
    auto number = [&](const json& a, const std::string& f, double& dst) {
      if (!a.is_number()) return errs.push_back(k + "." + f + ": expected a number, got " + a.dump());
      const double x = a.get<double>();
      if (!std::isfinite(x) || x < 0)
        return errs.push_back(k + "." + f + ": " + a.dump() + ", expected >= 0");
      dst = x;
    };
    for (auto it = o.begin(); it != o.end(); ++it) {
      const std::string& f = it.key();
      const json& a = it.value();
      if (f == "name") {
        if (!a.is_string())
          errs.push_back(k + ".name: expected a string, got " + a.dump());
        else
          g.name = a.get<std::string>();
      } else if (f == "parts") {
        strings(a, f, g.parts);
      } else if (f == "params") {
        strings(a, f, g.params);
      } else if (f == "params_regex") {
        strings(a, f, g.params_regex);
      } else if (f == "lr") {
        number(a, f, g.lr);
      } else if (f == "weight_decay") {
        number(a, f, g.weight_decay);
      } else if (f == "freeze") {
        if (!a.is_boolean())
          errs.push_back(k + ".freeze: expected true or false, got " + a.dump());
        else
          g.freeze = a.get<bool>();
      } else {
        errs.push_back(k + "." + f +
                       ": unknown key (a group has name, parts, params, params_regex, lr, weight_decay, "
                       "freeze)");
      }
    }
    out.push_back(g);
  }
  return out;
}

json to_json(const ParamGroupConfig& g) {
  json j = json::object();
  if (!g.name.empty()) j["name"] = g.name;
  if (!g.parts.empty()) j["parts"] = g.parts;
  if (!g.params.empty()) j["params"] = g.params;
  if (!g.params_regex.empty()) j["params_regex"] = g.params_regex;
  if (g.lr >= 0) j["lr"] = g.lr;
  if (g.weight_decay >= 0) j["weight_decay"] = g.weight_decay;
  if (g.freeze) j["freeze"] = true;
  return j;
}

std::vector<ParamGroupConfig> effective_param_groups(const OptimizerSection& o) {
  std::vector<ParamGroupConfig> out = o.groups;
  for (size_t i = 0; i < out.size(); ++i) out[i].name = group_name(out[i], i);
  auto shorthand = [&](double lr, const char* name, const char* part) {
    if (lr <= 0) return;
    ParamGroupConfig g;
    g.name = name;
    g.parts = {part};
    g.lr = lr;
    out.push_back(g);
  };
  shorthand(o.mm_projector_lr, "mm_projector_lr", "projector");
  shorthand(o.mm_vision_tower_lr, "mm_vision_tower_lr", "vision_tower");
  return out;
}

std::vector<std::string> check_param_groups(const OptimizerSection& o) {
  std::vector<std::string> e;
  const std::set<std::string> known(param_parts().begin(), param_parts().end());
  std::string known_list;
  for (const auto& p : param_parts()) known_list += (known_list.empty() ? "" : ", ") + p;
  std::set<std::string> names{"default"};
  for (size_t i = 0; i < o.groups.size(); ++i) {
    const ParamGroupConfig& g = o.groups[i];
    const std::string k = "optimizer.groups[" + std::to_string(i) + "]";
    if (g.parts.empty() && g.params.empty() && g.params_regex.empty())
      e.push_back(k + ": selects nothing; give parts, params (globs) or params_regex");
    for (const auto& p : g.parts)
      if (!known.count(p))
        e.push_back(k + ".parts: unknown part \"" + p + "\", expected one of " + known_list);
    for (const auto& p : g.params)
      if (p.empty()) e.push_back(k + ".params: empty pattern");
    for (const auto& r : g.params_regex) {
      try {
        std::regex re(r);
      } catch (const std::regex_error& ex) {
        e.push_back(k + ".params_regex: \"" + r + "\" is not a valid regex (" + ex.what() + ")");
      }
    }
    if ((g.lr < 0 && g.lr != -1) || !std::isfinite(g.lr))
      e.push_back(k + ".lr: " + num(g.lr) + ", expected >= 0");
    if ((g.weight_decay < 0 && g.weight_decay != -1) || !std::isfinite(g.weight_decay))
      e.push_back(k + ".weight_decay: " + num(g.weight_decay) + ", expected >= 0");
    if (g.freeze && (g.lr >= 0 || g.weight_decay >= 0))
      e.push_back(k + ": freeze with lr or weight_decay; a frozen group has no optimizer (drop one of them)");
    const std::string n = group_name(g, i);
    if (!names.insert(n).second)
      e.push_back(k + ".name: \"" + n +
                  "\" is used twice (or is the reserved name of the ungrouped parameters)");
  }
  auto shorthand = [&](double lr, const char* key, const char* part) {
    const std::string k = std::string("optimizer.") + key;
    if (lr < 0 || !std::isfinite(lr)) e.push_back(k + ": " + num(lr) + ", expected >= 0 (0 = unset)");
    if (lr <= 0) return;
    for (size_t i = 0; i < o.groups.size(); ++i)
      for (const auto& p : o.groups[i].parts)
        if (p == part)
          e.push_back(k + ": optimizer.groups[" + std::to_string(i) + "] names part " + part +
                      " too; set its lr there, or drop the part from the group");
    if (names.count(key)) e.push_back(k + ": a group is named \"" + key + "\" already");
  };
  shorthand(o.mm_projector_lr, "mm_projector_lr", "projector");
  shorthand(o.mm_vision_tower_lr, "mm_vision_tower_lr", "vision_tower");
  return e;
}

ResolvedParamGroups resolve_param_groups(const OptimizerSection& o,
                                         const std::vector<ParamGroupInput>& params,
                                         std::vector<std::string>* problems) {
  const std::vector<ParamGroupConfig> cfg = effective_param_groups(o);
  ResolvedParamGroups r;
  r.groups.push_back({"default", "optimizer", o.lr, o.weight_decay, false, 0, 0, 0});
  std::vector<Matcher> match;
  for (size_t i = 0; i < cfg.size(); ++i) {
    const ParamGroupConfig& g = cfg[i];
    const std::string key =
        i < o.groups.size() ? "optimizer.groups[" + std::to_string(i) + "]" : "optimizer." + g.name;
    r.groups.push_back({g.name, key, g.lr >= 0 ? g.lr : o.lr,
                        g.weight_decay >= 0 ? g.weight_decay : o.weight_decay, g.freeze, 0, 0, 0});
    Matcher m;
    m.parts.insert(g.parts.begin(), g.parts.end());
    m.globs = g.params;
    for (const auto& re : g.params_regex) m.regexes.emplace_back(re);
    match.push_back(std::move(m));
  }
  std::set<std::string> parts_present;
  for (const ParamGroupInput& p : params) {
    parts_present.insert(p.part);
    int g = 0;
    for (size_t i = 0; i < match.size() && g == 0; ++i)
      if (match[i](p.name, p.part)) g = int(i) + 1;
    ResolvedGroup& rg = r.groups[size_t(g)];
    if (p.frozen || rg.freeze) {
      r.group_of.push_back(-1);
      if (g > 0) rg.frozen_params += p.numel;
    } else {
      r.group_of.push_back(g);
      rg.params += p.numel;
      ++rg.tensors;
    }
  }
  std::vector<std::string> errs;
  for (size_t i = 1; i < r.groups.size(); ++i) {
    const ResolvedGroup& g = r.groups[i];
    const ParamGroupConfig& c = cfg[i - 1];
    std::string sel;
    for (const auto& p : c.parts) sel += (sel.empty() ? "parts " : ", ") + p;
    for (const auto& p : c.params) sel += (sel.empty() ? "" : "; ") + std::string("params ") + p;
    for (const auto& p : c.params_regex) sel += (sel.empty() ? "" : "; ") + std::string("params_regex ") + p;
    if (g.params == 0 && g.frozen_params == 0) {
      std::string have;
      for (const auto& p : parts_present) have += (have.empty() ? "" : ", ") + p;
      errs.push_back(g.key + " (" + g.name + "): " + sel + " matches no parameter of the model (its parts: " +
                     have + "; an earlier group may have taken them)");
    } else if (g.params == 0 && !g.freeze) {
      errs.push_back(
          g.key + " (" + g.name + "): " + sel + " matches " + std::to_string(g.frozen_params) +
          " parameters, all frozen (by freeze.*: e.g. freeze.vision is true by default), so its lr "
          "and weight_decay would apply to nothing; unfreeze them or drop the group");
    }
  }
  if (problems) {
    problems->insert(problems->end(), errs.begin(), errs.end());
  } else if (!errs.empty()) {
    std::string msg = "optimizer.groups: " + std::to_string(errs.size()) + " problem(s):";
    for (const auto& m : errs) msg += "\n  " + m;
    throw std::invalid_argument(msg);
  }
  return r;
}

json ResolvedParamGroups::to_json() const {
  json a = json::array();
  for (const auto& g : groups)
    a.push_back({{"name", g.name},
                 {"lr", g.lr},
                 {"weight_decay", g.weight_decay},
                 {"freeze", g.freeze},
                 {"params", g.params},
                 {"tensors", g.tensors}});
  return a;
}

std::string describe_group_changes(const json& saved, const ResolvedParamGroups& now) {
  const json n = now.to_json();
  if (saved == n) return "";
  std::string out;
  auto find = [](const json& a, const std::string& name) -> json {
    if (a.is_array())
      for (const auto& g : a)
        if (g.is_object() && g.value("name", "") == name) return g;
    return json();
  };
  for (const auto& g : n) {
    const json s = find(saved, g["name"].get<std::string>());
    if (s.is_null()) {
      out += "\n  group " + g["name"].get<std::string>() + ": new " + g.dump();
      continue;
    }
    for (const char* k : {"lr", "weight_decay", "freeze", "params", "tensors"})
      if (s.value(k, json()) != g[k])
        out += "\n  group " + g["name"].get<std::string>() + " " + k + ": checkpoint " +
               s.value(k, json()).dump() + ", now " + g[k].dump();
  }
  if (saved.is_array())
    for (const auto& s : saved)
      if (s.is_object() && find(n, s.value("name", "")).is_null())
        out += "\n  group " + s.value("name", std::string("?")) + ": gone (was " + s.dump() + ")";
  return out.empty() ? "\n  group order changed" : out;
}

}  // namespace gmod

// optimizer.groups (ParamGroupConfig in trainer/config/train_config.h): reading them from the config JSON,
// checking them, and resolving them against a model's parameters: the part each parameter belongs to, the
// group that takes it (the first that matches), which parameters are frozen, and each group's learning rate,
// weight decay and parameter counts. The trainer (freeze_and_count, setup_optimizer, the checkpoint) and
// `gmod plan` resolve with the same function, so the plan counts what the run trains.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gmod {

struct OptimizerSection;
struct ParamGroupConfig;

// The part names ParamGroupConfig::parts accepts, and the part of a parameter of MultimodalLM (names as
// named_parameters gives them): "lora" (a LoRA adapter: ".lora_A." / ".lora_B." in the name),
// "vision_adapters" (a tower's trainable adapters, VisionTower::is_adapter: LLaVA-HR's stitch adapters, MGM's
// mining projectors), "vision_tower" (the rest of vision.*), "projector" (projector.*), "routers" (MoD
// routers: mod_router.* and llm.layers.N.router.*), "llm" (everything else: embeddings, decoder layers, norm,
// lm_head).
const std::vector<std::string>& param_parts();
std::string param_part(const std::string& name, bool vision_adapter);

// optimizer.groups from its JSON array; every problem (key first, e.g. "optimizer.groups[1].lr: ...") is
// appended to errs and the group left at its defaults.
std::vector<ParamGroupConfig> param_groups_from_json(const nlohmann::json& v, const std::string& key,
                                                     std::vector<std::string>& errs);
// A group as JSON: the keys that are set.
nlohmann::json to_json(const ParamGroupConfig& g);
// optimizer.groups followed by the groups of mm_projector_lr and mm_vision_tower_lr when set, names filled
// in.
std::vector<ParamGroupConfig> effective_param_groups(const OptimizerSection& o);
// Every problem of the groups and shorthands, key first (unknown part, a group that selects nothing, a bad
// regex, a negative lr, lr on a frozen group, duplicate names, a shorthand whose part a group names too).
std::vector<std::string> check_param_groups(const OptimizerSection& o);

// One parameter for resolve_param_groups.
struct ParamGroupInput {
  std::string name;
  int64_t numel = 0;
  std::string part;     // param_part(name, ...)
  bool frozen = false;  // frozen by freeze.* (or by the model set-up, e.g. LoRA's base weights)
};

struct ResolvedGroup {
  std::string name;  // "default" for group 0
  std::string key;  // where it is configured: "optimizer.groups[2]", "optimizer.mm_projector_lr", "optimizer"
  double lr = 0, weight_decay = 0;
  bool freeze = false;
  int64_t params = 0, tensors = 0;  // trainable parameters it holds
  int64_t frozen_params = 0;        // parameters it matched that do not train (its freeze, or freeze.*)
};

struct ResolvedParamGroups {
  // [0] = "default" (trainable parameters no group matched: optimizer.lr / weight_decay), then the effective
  // groups in order; the optimizer's group index is the index here (frozen groups hold no parameter).
  std::vector<ResolvedGroup> groups;
  std::vector<int> group_of;  // per input parameter: its group, or -1 when it does not train
  bool grouped() const { return groups.size() > 1; }
  // [{"name", "lr", "weight_decay", "freeze", "params", "tensors"}] as a checkpoint holds them.
  nlohmann::json to_json() const;
};

// The first group that matches takes a parameter; a freeze group freezes it. Throws std::invalid_argument
// naming every configured group that matches no parameter of the model, or only frozen ones while it is not a
// freeze group itself (its settings would apply to nothing: almost always a typo or a part frozen by
// freeze.*). With `problems`, appends those messages there instead (gmod plan reports them and plans on).
ResolvedParamGroups resolve_param_groups(const OptimizerSection& o,
                                         const std::vector<ParamGroupInput>& params,
                                         std::vector<std::string>* problems = nullptr);

// "" when `saved` (a checkpoint's ResolvedParamGroups::to_json) equals `now`; else one line per difference.
std::string describe_group_changes(const nlohmann::json& saved, const ResolvedParamGroups& now);

}  // namespace gmod

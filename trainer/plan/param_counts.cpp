// Parameter counts of the model as MultimodalLM builds it (model/llava.cpp, model/clip.cpp, model/convnext.h,
// model/mr_adapters.h, mod routers), for the memory plan (trainer/plan/memory_plan.h), including the sizes of
// the ZeRO-3 units (a decoder layer, a vision block, the embeddings, the head).
#include <algorithm>
#include <set>

#include "mod/layer_costs.h"
#include "trainer/plan/memory_plan.h"

namespace gmod {
namespace {

// A timm ConvNeXt's stem and stages (model/convnext.h), parameter count; `largest_stage`: the largest stage
// (downsampling + blocks), a ZeRO-3 unit (parallel/zero3_driver.h hooks ConvNeXt stages).
int64_t convnext_params(const ConvNextConfig& c, int64_t* largest_stage = nullptr, int64_t* stages = nullptr) {
  const int64_t k2 = int64_t(c.kernel_size) * c.kernel_size, r = c.mlp_ratio;
  int64_t n = int64_t(c.dims[0]) * c.in_chans * c.patch_size * c.patch_size + 3 * int64_t(c.dims[0]);
  for (size_t i = 0; i < c.dims.size(); ++i) {
    const int64_t C = c.dims[i];
    int64_t stage = i > 0 ? 2 * int64_t(c.dims[i - 1]) + C * c.dims[i - 1] * 4 + C : 0;
    stage += c.depths[i] * (C * k2 + C + 2 * C + 2 * r * C * C + r * C + C + (c.ls_init_value > 0 ? C : 0));
    n += stage;
    if (largest_stage) *largest_stage = std::max(*largest_stage, stage);
    if (stages) *stages += stage;
  }
  return n;
}

// LLaVA-HR's ConvNeXt and adapters (model/mr_adapters.h), parameter counts.
int64_t multipath_extra_params(const MultipathConfig& m, int64_t d) {
  int64_t n = convnext_params(m.slow);
  const int64_t s = m.slow.dims.back();
  if (m.stitch)
    n += 3 * ((s * s + s) + (d * s + d) + (d * 49 + d) + (d * d + d) + (2 * d * (d / 2) + d / 2) + (d / 2 + 1));
  return n + (d * d + d) + (d * s + d);
}

}  // namespace

int64_t mgm_mining_params(const MgmConfig& m, int64_t d) {
  const int64_t a = m.aux_channels();
  return (2 * d + d * d + d) + 2 * (2 * a + a * d + d);
}

ParamCounts count_params(const LlavaConfig& c, const std::vector<int>& mod_layers,
                         const std::string& mod_router) {
  ParamCounts p;
  const LlamaConfig& t = c.text;
  const int64_t D = t.hidden_size, I = t.intermediate_size, Dh = t.dim_per_head();
  const int64_t qd = int64_t(t.num_attention_heads) * Dh, kvd = int64_t(t.num_key_value_heads) * Dh;
  const int64_t qkvb = t.attention_bias || t.qkv_bias ? 1 : 0, ob = t.attention_bias ? 1 : 0;
  const int64_t mb = t.mlp_bias ? 1 : 0;
  const int64_t attn = D * qd + 2 * D * kvd + qd * D + qkvb * (qd + 2 * kvd) + ob * D;
  const int64_t mlp = 3 * D * I + mb * (2 * I + D);
  const std::set<int> mods(mod_layers.begin(), mod_layers.end());
  const LayerCosts costs = layer_costs(router_kind(mod_router, "memory plan: mod_router"), D);
  p.embed = int64_t(t.vocab_size) * D;
  p.lm_head = t.tie_word_embeddings ? 0 : int64_t(t.vocab_size) * D;
  p.llm = p.embed + p.lm_head + D;  // + final norm
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    int64_t n = attn + mlp + 2 * D + (t.qk_norm ? 2 * Dh : 0);  // Qwen3: q_norm, k_norm [head_dim]
    if (mods.count(l)) n += costs.layer_router_params;  // a per-layer router (mod/layer_costs.h)
    p.llm_layer.push_back(n);
    p.llm += n;
  }
  if (!mods.empty() && costs.shared_router_params > 0) {
    p.shared_router = costs.shared_router_params;  // γ-MoD's mod_router.weight [2, D]
    p.llm += p.shared_router;
  }
  if (const auto tc = tower_costs(c)) {  // a tower with its own cost model
    p.vision = tc->params();
    p.projector = tc->projector_params();
    for (int64_t n : tc->hooked_units()) p.vision_unit = std::max(p.vision_unit, n), p.vision_hooked += n;
  } else if (c.vision) {
    const ClipVisionConfig& v = *c.vision;
    const int64_t Dv = v.hidden_size, Iv = v.intermediate_size;
    const int64_t layer = 4 * (Dv * Dv + Dv) + (Dv * Iv + Iv) + (Iv * Dv + Dv) + 4 * Dv;
    // CLIP: class embedding, patch conv, positions (class + patches), pre_layrnorm and post_layernorm; SigLIP: the
    // conv's bias instead of the class embedding, a position per patch, post_layernorm only.
    p.vision = Dv + Dv * v.num_channels * v.patch_size * v.patch_size + int64_t(v.tokens()) * Dv +
               (v.siglip() ? 2 : 4) * Dv + layer * v.num_hidden_layers;
    p.projector = Dv * D + D + D * D + D;
    p.vision_unit = layer;
    p.vision_hooked = layer * v.num_hidden_layers;
    if (c.multipath) {  // LLaVA-HR: all CLIP layers run, plus the ConvNeXt and the adapters
      p.vision += multipath_extra_params(*c.multipath, Dv);
      convnext_params(c.multipath->slow, &p.vision_unit, &p.vision_hooked);
    }
    if (c.mgm) {  // MGM: the aux ConvNeXt and the patch info mining projectors
      p.vision += convnext_params(c.mgm->aux, &p.vision_unit, &p.vision_hooked) + mgm_mining_params(*c.mgm, Dv);
    }
  }
  return p;
}

LoraLayerCounts lora_layer_counts(const LlamaConfig& t, int r, const std::vector<std::string>& targets) {
  LoraLayerCounts c;
  if (r <= 0) return c;
  const int64_t D = t.hidden_size, I = t.intermediate_size, Dh = t.dim_per_head();
  const int64_t qd = int64_t(t.num_attention_heads) * Dh, kvd = int64_t(t.num_key_value_heads) * Dh;
  const std::pair<const char*, std::pair<int64_t, int64_t>> linears[] = {  // name, (in, out) as model/layers.cpp
      {"q_proj", {D, qd}},    {"k_proj", {D, kvd}}, {"v_proj", {D, kvd}},   {"o_proj", {qd, D}},
      {"gate_proj", {D, I}}, {"up_proj", {D, I}},  {"down_proj", {I, D}}};
  for (const auto& [name, io] : linears) {
    bool hit = false;
    for (const auto& x : targets) {  // an entry names a linear by its leaf ("q_proj", "mlp.up_proj") or all-linear
      const std::string leaf = x.substr(x.rfind('.') == std::string::npos ? 0 : x.rfind('.') + 1);
      hit = hit || x == "all-linear" || leaf == name;
    }
    if (!hit) continue;
    c.params += int64_t(r) * (io.first + io.second);
    c.inputs += io.first;
    ++c.linears;
  }
  return c;
}

Zero3Units zero3_units(const ParamCounts& pc, const LlavaConfig& c, const MemoryPlanInputs& in) {
  Zero3Units u;
  auto unit = [&u](int64_t n) {
    if (n <= 0) return;
    u.max_unit = std::max(u.max_unit, n);
    u.hooked += n;
    ++u.count;
  };
  if (in.train_vision && c.vision) {
    // Every CLIP layer (also those past vision_feature_layer: gathered in turn, not run) and ConvNeXt stage.
    u.max_unit = std::max(u.max_unit, pc.vision_unit);
    u.hooked += pc.vision_hooked;
    u.count += c.vision->num_hidden_layers;
    if (c.multipath) u.count += int(c.multipath->slow.dims.size());
    if (c.mgm) u.count += int(c.mgm->aux.dims.size());
  } else if (in.train_vision) {
    if (const auto tc = tower_costs(c))
      for (int64_t n : tc->hooked_units()) unit(n);  // Qwen2.5-VL: each encoder block, then the merger
  }
  if (in.train_llm) {
    const std::set<int> frozen(in.frozen_llm_layers.begin(), in.frozen_llm_layers.end());
    for (size_t l = 0; l < pc.llm_layer.size(); ++l)
      if (!frozen.count(int(l))) unit(pc.llm_layer[l]);
  }
  return u;  // (persistent: the trainable count minus `hooked`, set by plan_memory, which knows what trains)
}

}  // namespace gmod

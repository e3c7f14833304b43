#include "trainer/plan/memory_probe.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <set>
#include <stdexcept>

#include "mod/conversion.h"
#include "mod/method_registry.h"
#include "mod/token_selection.h"
#include "model/activation_checkpoint.h"
#include "model/anyres_grid.h"
#include "model/llava.h"
#include "model/lm_loss.h"
#include "model/lora.h"
#include "model/strings.h"
#include "model/token_roles.h"
#include "model/unit_hooks.h"
#include "parallel/data_parallel.h"
#include "parallel/dp_strategy.h"
#include "trainer/plan/memory_tracker.h"
#include "trainer/plan/tower_costs.h"

namespace gmod {
namespace {

// One micro-batch of full-length samples: [BOS, image tokens..., text...], the text a question (unsupervised)
// and then the answer, whose round(supervised_fraction * (L - 1)) tokens carry labels, no padding (the plan
// assumes padded length = seq_len). Towers of variable patch grids (TowerCosts) get each image at the plan's size
// (`visual`): its patches, its grid row, its LLM tokens, one text token between two images (a run of image tokens
// is one image to the rotary positions).
ModelInputs synthetic_batch(const LlavaConfig& c, int B, int L, int images, double supervised_fraction,
                            const VisualInputs& visual, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t V = c.text.vocab_size;
  const std::unique_ptr<TowerCosts> tc = tower_costs(c);
  if (tc && images > 0 && visual.frames > 1)
    throw std::invalid_argument("memory probe: videos (frames " + std::to_string(visual.frames) +
                                ") are not measured yet; images only");
  int64_t per_image = tc ? tc->llm_tokens(visual) : c.image_seq_length(), tiles = 1;
  // AnyRes (LLaVA-NeXT): every image the size of the pinpoint that gives the most tokens, so that it fills its grid.
  std::array<int, 2> anyres_size{0, 0};
  if (!tc && c.anyres && c.vision) {
    const int tile = c.vision->image_size, side = tile / c.vision->patch_size;
    for (const auto& p : c.anyres->pinpoints) {
      const int64_t n = anyres_image_tokens(p[0], p[1], *c.anyres, tile, side);
      if (n > per_image || anyres_size[0] == 0) {
        per_image = n;
        anyres_size = p;
        tiles = anyres_num_tiles(p[0], p[1], *c.anyres, tile);
      }
    }
  }
  const int64_t gap = tc ? 1 : 0;  // text tokens between two images (variable-grid towers)
  const int64_t T = images > 0 ? per_image * images + gap * (images - 1) : 0;
  if (T + 4 > L)
    throw std::invalid_argument("memory probe: seq_len " + std::to_string(L) + " too short for " +
                                std::to_string(T) + " image tokens");
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  ModelInputs in;
  // Text ids avoid 0..2 (pad/bos/eos) and the image (and video) token.
  at::Tensor ids = at::randint(3, std::max<int64_t>(4, V - 1), {B, L}, gen, lopt);
  ids.masked_fill_(ids == c.image_token_id, 3);
  if (c.mrope) ids.masked_fill_(ids == c.mrope->video_token_id, 3);  // a video's token would start a video
  at::Tensor roles = at::full({B, L}, int64_t(TokenRole::kQuestion), lopt);
  ids.select(1, 0).fill_(c.text.bos_token_id);
  roles.select(1, 0).fill_(int64_t(TokenRole::kSystem));
  for (int64_t i = 0; i < (T > 0 ? images : 0); ++i) {
    ids.narrow(1, 1 + i * (per_image + gap), per_image).fill_(c.image_token_id);
    roles.narrow(1, 1 + i * (per_image + gap), per_image).fill_(int64_t(TokenRole::kImage));
  }
  const int64_t n_sup = std::llround(supervised_fraction * double(L - 1));
  if (supervised_fraction < 0 || n_sup > L - 1 - T)
    throw std::invalid_argument("memory probe: supervised_fraction " + std::to_string(supervised_fraction) +
                                " labels more than the " + std::to_string(L - 1 - T) +
                                " text tokens of a sample");
  const int64_t answer = L - n_sup;
  roles.narrow(1, answer, L - answer).fill_(int64_t(TokenRole::kAnswer));
  in.labels = ids.clone();
  in.labels.narrow(1, 0, answer).fill_(-100);
  in.input_ids = ids;
  in.token_roles = roles.to(at::kChar);
  in.attention_mask = at::ones({B, L}, at::TensorOptions().dtype(at::kBool));
  if (T > 0 && tc) {
    const auto g = tc->grid(visual);
    in.pixel_values = at::randn({int64_t(B) * images * tc->patches(visual), tc->pixel_elements(visual) / tc->patches(visual)},
                                gen, at::TensorOptions().dtype(at::kFloat));
    in.image_grid_thw = at::tensor(std::vector<int64_t>{g[0], g[1], g[2]}, lopt).repeat({int64_t(B) * images, 1});
  } else if (T > 0) {
    const int S = c.image_input_size();
    in.pixel_values =
        at::randn({int64_t(B) * images * tiles, 3, S, S}, gen, at::TensorOptions().dtype(at::kFloat));
    if (anyres_size[0] > 0)
      in.image_sizes = at::tensor(std::vector<int64_t>{anyres_size[0], anyres_size[1]}, lopt)
                           .repeat({int64_t(B) * images, 1});
  }
  return in;
}

}  // namespace

MemoryMeasurement measure_training_memory(const MemoryPlanInputs& in, std::shared_ptr<Comm> comm, int steps,
                                          uint64_t seed) {
  if (comm->world_size() != in.world)
    throw std::invalid_argument("memory probe: plan is for world " + std::to_string(in.world) +
                                ", comm has " + std::to_string(comm->world_size()) + " ranks");
  MemoryTracker& tracker = MemoryTracker::install();
  const at::ScalarType dtype = in.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const int64_t base = tracker.live_bytes();
  MemoryMeasurement m;
  {
    // The model as the trainer builds it (Trainer::load_model, convert_model, freeze_and_count,
    // setup_optimizer).
    auto model = std::make_shared<MultimodalLM>(in.model);
    model->init_weights(seed);
    model->to(at::kCPU, dtype);
    if (!in.mod_layers.empty()) {
      MoDConfig mc;
      mc.mod_layers = in.mod_layers;
      const TokenSelector& method = method_named(in.mod_router, "memory probe: mod_router");
      // Methods whose rule decides their layers set their router (and its settings) themselves, as in training.
      if (in.mod_rule.empty() || !method.layers_from_rule()) mc.router = method.kind();
      // kept fraction = 1 - skip_frac * routable / L with routable = the image tokens (the probe's batches).
      const auto tc = tower_costs(in.model);
      const int64_t image_tokens = tc ? tc->llm_tokens(in.visual) : anyres_image_bound(in.model).tokens;
      const double routable = double(image_tokens * in.images_per_sample) / double(in.seq_len);
      mc.skip_frac = routable > 0 ? std::min(1.0, (1.0 - in.mod_kept_fraction) / routable) : 0.0;
      if (!in.mod_rule.empty()) {  // the rule decides the layers and what they keep (p-MoD, PyramidDrop), as in training
        const int n = in.model.text.num_hidden_layers;
        std::vector<double> arank(static_cast<size_t>(n));
        for (int l = 0; l < n; ++l) arank[size_t(l)] = double(n - l);  // plan_inputs_from_config's stand-in
        mc.mod_layers.clear();  // config_for_rule takes given layers as they are
        mc = config_for_rule(in.mod_rule, mc, n, arank);
        if (mc.mod_layers != in.mod_layers)
          throw std::invalid_argument("memory probe: mod_rule \"" + in.mod_rule + "\" routes other layers than the inputs");
      } else if (method.layers_from_rule()) {
        throw std::invalid_argument("memory probe: " + in.mod_router + " layers need the mod_rule they came from");
      }
      convert_to_mod(*model, mc);
      model->to(at::kCPU, dtype);
    }
    if (in.lora_r > 0) {  // as Trainer: after the MoD conversion
      LoraConfig lc;
      lc.r = in.lora_r;
      lc.alpha = 2.0 * in.lora_r;
      lc.dropout = in.lora_dropout;
      lc.targets = in.lora_targets;
      attach_lora(*model, lc, seed);
    }
    model->train();
    // Activation checkpointing as Trainer::load_model sets it: decoder layers, the tower's units with them.
    model->llm->activation_checkpointing = parse_activation_checkpointing(
        in.checkpointing == "every_k" ? "every_" + std::to_string(in.checkpoint_every) : in.checkpointing);
    if (model->vision)
      model->vision->set_activation_checkpointing(model->llm->activation_checkpointing.enabled());
    const std::set<int> frozen(in.frozen_llm_layers.begin(), in.frozen_llm_layers.end());
    DataParallelOptimizer::NamedParams trainable;
    for (auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      bool train;
      if (starts_with(name, "vision."))
        train = in.train_vision;
      else if (starts_with(name, "projector."))
        train = in.train_projector;
      else {
        train = in.lora_r > 0 ? is_lora_parameter(name) || name.find("router") != std::string::npos : in.train_llm;
        if (train && starts_with(name, "llm.layers.")) train = !frozen.count(std::stoi(name.substr(11)));
      }
      item.value().set_requires_grad(train);
      if (train) trainable.emplace_back(name, item.value());
    }
    DpSettings settings;
    settings.zero_stage = in.stage;
    settings.zero3_prefetch = in.zero3_prefetch;
    settings.zero3_reshard_after_forward = in.zero3_reshard_after_forward;
    DataParallelOptions& o = settings.options;
    o.bucket_bytes = in.bucket_bytes;
    o.accumulate_fp32 = in.accumulate_fp32;
    o.reduce_dtype = in.reduce_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    o.max_grad_norm = 1.0;
    o.lr = 1e-4;
    o.offload = in.offload == "cpu";
    // The strategy as Trainer::setup_optimizer builds it (parallel/dp_strategy.h).
    std::unique_ptr<DpStrategy> dp = make_dp_strategy(settings, trainable, comm, hooked_units(*model));
    trainable.clear();

    std::vector<ModelInputs> micro;
    for (int k = 0; k < in.grad_accum; ++k)
      micro.push_back(synthetic_batch(in.model, in.micro_batch, in.seq_len, in.images_per_sample,
                                      in.supervised_fraction, in.visual,
                                      seed + 1000 * uint64_t(comm->rank()) + uint64_t(k)));
    m.steady_bytes = tracker.live_bytes() - base;
    m.host_state_bytes = dp->host_state_bytes();
    tracker.reset_peak();
    comm->reset_stats();
    const CommStats side0 = dp->side_comm_stats();  // the strategy's reduction communicator, before the steps
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < steps; ++step) {
      // Trainer::train_step: global supervised-token count, then per micro-batch world * sum / N, backward.
      int64_t local_sup = 0;
      for (const auto& b : micro)
        local_sup += b.labels.narrow(1, 1, b.labels.size(1) - 1).ne(-100).sum().item<int64_t>();
      const double n_sup = comm->all_reduce(double(local_sup), ReduceOp::Sum);
      for (size_t k = 0; k < micro.size(); ++k) {
        ForwardState st;
        // Trainer::train_step: the batch keeps its fp32 pixels, the forward gets a compute-dtype copy.
        ModelInputs in_k = micro[k];
        if (in_k.pixel_values.defined()) in_k.pixel_values = in_k.pixel_values.to(dtype);
        dp->begin_forward();
        ModelOutput out = forward_label_loss(*model, in_k, st);
        at::Tensor loss = out.lm_loss_sum * (double(in.world) / std::max(1.0, n_sup));
        if (!st.aux_losses.empty()) loss = loss + total_routing_loss(st, MoDConfig{}) / double(micro.size());
        // (stage 3: before end_forward attaches the persistent units' gradient buffers for the backward)
        m.after_forward_bytes = tracker.live_bytes() - base;
        dp->end_forward();
        if (k + 1 == micro.size()) dp->set_last_micro_batch();
        loss.backward();
        dp->end_backward();
      }
      dp->step({1e-4});
    }
    m.peak_bytes = tracker.peak_bytes() - base;
    const int n = std::max(1, steps);
    m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n;
    CommStats st = comm->stats();
    const CommStats side = dp->side_comm_stats();  // since the strategy was built; minus before the steps
    st.payload_bytes += side.payload_bytes - side0.payload_bytes;
    st.wire_bytes += side.wire_bytes - side0.wire_bytes;
    m.comm_payload_bytes = st.payload_bytes / n;
    m.comm_wire_bytes = st.wire_bytes / n;
  }
  return m;
}

}  // namespace gmod

// MemoryPlan: per-rank bytes of one training step (weights, gradients, optimizer state, activations,
// transients) and per-step communication volume, derived from what the code allocates, for `gmod plan` and
// for checking a configuration before a run. Every term names the code it mirrors
// (parallel/data_parallel.cpp, parallel/sharded_adamw.cpp, model/layers.cpp, mod/mod_layer.cpp,
// trainer/trainer.cpp); when that code changes, change the term here. The peak is the largest of the step's
// phases (end of forward, loss backward, layer backward, end of backward with gradient buckets in flight,
// optimizer step), each the sum of the terms alive in it. Validated against the measured peak of real CPU
// training steps (tests/trainer/mpi_memory_plan_test.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/cpu_kernels.h"
#include "mod/method_registry.h"
#include "trainer/plan/tower_costs.h"

namespace gmod {

struct TrainConfig;
struct RunPlan;

// What the plan needs; plan_inputs_from_config() fills it from a TrainConfig.
struct MemoryPlanInputs {
  LlavaConfig model;
  int world = 1;
  int stage = 1;               // ZeRO stage 0-3 (optimizer.zero_stage)
  // optimizer.offload: "cpu" puts the fp32 master and moments (and, on CUDA, a host copy of the gradient shard and
  // of the converted parameter shard) in host memory: `host_terms`, not the device total.
  std::string offload = "none";
  // checkpoint.async: each save's state is copied to host memory for its background write (a host term).
  bool async_checkpoint = false;
  int zero3_prefetch = 1;      // ZeRO-3: units gathered ahead of the running one (optimizer.zero3_prefetch)
  // ZeRO-3: false keeps each unit gathered from its forward to its backward (optimizer.zero3_reshard_after_forward).
  bool zero3_reshard_after_forward = true;
  std::string dtype = "bf16";  // parameter/compute dtype: "fp32" or "bf16" (model.dtype)
  int micro_batch = 1;         // samples per forward/backward (batch.micro_batch)
  int seq_len = 2048;         // padded tokens per sample (data.max_len: the plan assumes full-length batches)
  int images_per_sample = 1;  // 0 = text-only batches
  // Towers of variable patch grids (Qwen2.5-VL): each visual input's size (max_pixels, frames; tower_costs.h).
  VisualInputs visual;
  // Fraction of the B*(L-1) next-token positions that carry a label (model/lm_loss.h computes the head and
  // the loss on those rows only). 1 = every position (the upper bound); LLaVA conversations are typically
  // 0.1-0.3.
  double supervised_fraction = 1.0;
  bool train_vision = false, train_projector = true, train_llm = true;  // freeze.* negated
  std::vector<int> frozen_llm_layers;                                   // freeze.llm_layers
  // Activation checkpointing of decoder layers: "none", "full" (every layer keeps only its input and is
  // recomputed in backward) or "every_k" (layers 0, k, 2k, ... are checkpointed).
  std::string checkpointing = "none";
  int checkpoint_every = 2;                 // k of "every_k"
  std::vector<int> mod_layers;              // MoD decoder layers (empty = dense)
  std::string mod_router = default_method_name();  // a registered method's name (mod/method_registry.h)
  // Fraction of a sample's tokens a MoD layer processes in training (k_b / L): 1 - skip_frac * routable / L.
  double mod_kept_fraction = 1.0;
  // The same per MoD layer (in mod_layers' order) where the layers differ (p-MoD's decaying ratios); empty: every
  // MoD layer keeps mod_kept_fraction (then the largest of these).
  std::vector<double> mod_kept_by_layer;
  // The mod.rule the layers came from, where it holds more than the layers and shares above (PyramidDrop's stages
  // and ratios): the memory probe builds the same layers from it.
  std::string mod_rule;
  bool accumulate_fp32 = false;       // fp32 gradient accumulation buffer for bf16 params
  std::string reduce_dtype = "fp32";  // gradient communication dtype
  int64_t bucket_bytes = int64_t(25) << 20;
  int grad_accum = 1;  // micro-batches per optimizer step (communication happens once per step)
  bool overlap_comm = true;  // optimizer.overlap_comm: buckets reduced during the last backward
  // "cpu" (MpiComm: fp32 upcast of bf16 reductions, a receive buffer per reduce-scatter) or "cuda"
  // (NcclComm).
  std::string device = "cpu";
  // device "cpu", bf16: whether LibTorch runs bf16 convolutions through oneDNN (AVX-512 and up) or through ATen's
  // own kernels (AVX2), whose backward temporaries differ (trainer/plan/tower_activation_plan.h). Default: what
  // this process does (model/cpu_kernels.h), i.e. the plan is for a CPU like the one it runs on.
  bool cpu_bf16_onednn = cpu_bf16_uses_onednn();
  double budget_bytes = 0;  // per-rank memory (0 = none: no fits verdict)
  double reserve_bytes =
      0;  // allowance outside the plan (CUDA context, NCCL/cuBLAS workspaces, fragmentation)
  // Parameters the train_* flags above leave trainable that optimizer.groups freeze (trainer/plan/
  // param_group_counts.h): no gradient, master or moments.
  int64_t frozen_by_groups = 0;
  // LoRA (lora.*, model/lora.h): rank (0 = none), the adapted linears by leaf name (q_proj ... down_proj;
  // "all-linear" = all seven), adapter dropout. The LLM's own weights are then frozen (compute dtype, no gradient,
  // master or moments); the adapters and MoD routers train.
  int lora_r = 0;
  std::vector<std::string> lora_targets;
  double lora_dropout = 0.0;
};

struct MemoryTerm {
  std::string name;
  int64_t bytes = 0;
  std::string what;  // what it is and which code allocates it
};

struct MemoryPhase {
  std::string name;
  int64_t bytes = 0;              // total live bytes in this phase (static terms included)
  std::vector<MemoryTerm> terms;  // the non-static terms alive in it
};

struct MemoryPlan {
  int64_t params_total = 0, params_trainable = 0, params_padded = 0, params_frozen = 0;
  // Terms alive at the peak (static ones first). Their sum is `total`.
  std::vector<MemoryTerm> terms;
  std::vector<MemoryPhase> phases;  // every phase's total; `peak_phase` is the largest
  std::string peak_phase;
  int64_t total = 0;
  // Activations saved for backward at the end of the forward (decoder layers, final norm, projector, rope),
  // for reference whether or not they are part of the peak phase.
  int64_t activations_saved = 0;
  // Per optimizer step, per rank: bytes each collective works on and the ring estimate of what one rank
  // sends.
  int64_t comm_payload_bytes = 0;
  double comm_wire_bytes = 0;
  std::vector<MemoryTerm> comm;  // per collective (payload bytes)
  // Host memory per rank (optimizer offload, async checkpoint snapshot): its terms and their sum; not part of `total` or the budget.
  std::vector<MemoryTerm> host_terms;
  int64_t host_total = 0;
  // ZeRO-3: the largest hooked unit (parameters gathered together around one unit's forward and backward)
  // and the persistent parameters, gathered from each micro-batch's forward to the end of its backward.
  int64_t zero3_unit_params = 0, zero3_persistent_params = 0;
  // CUDA only: how far the caching allocator's *reserved* memory may exceed `total` when the reductions lag the
  // backward (slow links, multi-node). Buckets (stage 2), ZeRO-3 unit gradients and reduce-dtype copies are freed
  // when their collective is enqueued (recordStream): the block is reusable only once the communication stream
  // has passed it, so in the worst case every one freed in the window stays reserved. Bounded by the gradient of
  // one backward (nothing is freed before it is written); 0 on CPU (MPI frees at completion, counted in `total`).
  int64_t cuda_reserved_lag_bytes = 0;
  double budget_bytes = 0, reserve_bytes = 0;
  bool has_budget = false, fits = true;

  const MemoryTerm* term(const std::string& name) const;  // nullptr if absent
  int64_t term_bytes(const std::string& name) const;      // 0 if absent
};

// Parameter counts of the model as MultimodalLM builds it (model/llava.cpp, model/clip.cpp, mod routers);
// trainer/plan/param_counts.cpp.
struct ParamCounts {
  int64_t vision = 0, projector = 0, llm = 0;  // llm: embeddings, layers, norm, lm_head, MoD routers
  std::vector<int64_t> llm_layer;              // per decoder layer (inside `llm`)
  int64_t embed = 0, lm_head = 0;
  int64_t vision_unit = 0;    // the largest vision unit (a CLIP layer or a ConvNeXt stage): a ZeRO-3 unit
  int64_t vision_hooked = 0;  // every CLIP layer and ConvNeXt stage (ZeRO-3 hooked units), summed
  int64_t shared_router = 0;  // γ-MoD's shared router (inside `llm`), used by every MoD layer
  int64_t total() const { return vision + projector + llm; }
};
// MGM's patch info mining projectors (model/patch_info_mining.h): LayerNorm + Linear for the query (D -> D),
// the keys and the values (C_aux -> D). They train whenever the projector does, also with frozen towers.
int64_t mgm_mining_params(const MgmConfig& m, int64_t d);

ParamCounts count_params(const LlavaConfig& c, const std::vector<int>& mod_layers,
                         const std::string& mod_router);

// ZeRO-3 units of the trainable parameters as parallel/zero3_driver.h forms them: *hooked* units (each trainable
// decoder layer, CLIP encoder layer and ConvNeXt stage), gathered around their forward and again for their
// backward, and the *persistent* rest (embeddings, LM head, final norm, projector, vision stem and norms, γ-MoD's
// shared router, adapters; tied embeddings are one tensor among them), gathered once per micro-batch from the
// start of its forward to the end of its backward. trainer/plan/param_counts.cpp.
struct Zero3Units {
  int64_t max_unit = 0;    // the largest hooked unit
  int64_t hooked = 0;      // parameters in hooked units
  int64_t persistent = 0;  // trainable parameters in no hooked unit
  int count = 0;           // hooked units
};
Zero3Units zero3_units(const ParamCounts& pc, const LlavaConfig& c, const MemoryPlanInputs& in);

// LoRA adapter parameters of one decoder layer (A [r, in] + B [out, r] per adapted linear) and the summed input
// widths of its adapted linears (what adapter dropout keeps per token); trainer/plan/param_counts.cpp.
struct LoraLayerCounts {
  int64_t params = 0, inputs = 0, linears = 0;
};
LoraLayerCounts lora_layer_counts(const LlamaConfig& t, int r, const std::vector<std::string>& targets);

MemoryPlan plan_memory(const MemoryPlanInputs& in);

// Inputs from a parsed training config (model config read separately, e.g. with load_model_config); every key
// comes from TrainConfig, so `gmod plan` takes exactly the configs `gmod train` takes.
// `visual`: the size of each visual input for towers of variable grids (Qwen2.5-VL; `gmod plan --max-pixels
// --frames`), which also sets the routable share of a sample MoD layers skip from.
MemoryPlanInputs plan_inputs_from_config(const TrainConfig& cfg, const LlavaConfig& model, int world,
                                         const VisualInputs& visual = {});
// The same from a run plan (trainer/run_plan.h): its batch, parallel and checkpointing settings as resolved.
MemoryPlanInputs plan_inputs_from_plan(const RunPlan& plan, const LlavaConfig& model,
                                       const VisualInputs& visual = {});

nlohmann::json to_json(const MemoryPlan& p);
// Human table: one line per term, the phases, communication, budget verdict.
std::string format_plan(const MemoryPlan& p);
std::string format_bytes(double bytes);  // "1.23 GiB"

}  // namespace gmod

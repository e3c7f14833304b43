#include "trainer/plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "mod/layer_costs.h"
#include "trainer/plan/layer_activation_plan.h"
#include "model/lm_loss.h"
#include "parallel/bucket_release.h"
#include "trainer/plan/tower_activation_plan.h"

namespace gmod {
namespace {

int64_t elt(const std::string& dtype, const char* what) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  throw std::invalid_argument(std::string("memory plan: ") + what + " must be fp32, bf16 or fp16, got \"" +
                              dtype + "\"");
}

std::set<int> layer_set(const std::vector<int>& v) { return std::set<int>(v.begin(), v.end()); }

}  // namespace

const MemoryTerm* MemoryPlan::term(const std::string& name) const {
  for (const auto& t : terms)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t MemoryPlan::term_bytes(const std::string& name) const {
  const MemoryTerm* t = term(name);
  return t ? t->bytes : 0;
}

namespace {
// LoRA without dropout: the widths of the distinct inputs its A matrices save per token (q/k/v share the normed
// input, gate/up the post-attention normed one).
int64_t lora_shared_inputs(const LlamaConfig& t, const std::vector<std::string>& targets) {
  auto has = [&](const char* name) {
    for (const auto& x : targets) {
      const std::string leaf = x.substr(x.rfind('.') == std::string::npos ? 0 : x.rfind('.') + 1);
      if (x == "all-linear" || leaf == name) return true;
    }
    return false;
  };
  const int64_t D = t.hidden_size;
  return (has("q_proj") || has("k_proj") || has("v_proj") ? D : 0) +
         (has("o_proj") ? int64_t(t.num_attention_heads) * t.dim_per_head() : 0) +
         (has("gate_proj") || has("up_proj") ? D : 0) + (has("down_proj") ? t.intermediate_size : 0);
}
}  // namespace

MemoryPlan plan_memory(const MemoryPlanInputs& given) {
  // LoRA: the LLM's own weights are frozen (trainer/trainer.cpp freeze_and_count), its adapters and routers train.
  const bool lora = given.lora_r > 0;
  MemoryPlanInputs in = given;
  if (lora) in.train_llm = false;
  const LlamaConfig& t = in.model.text;
  if (in.world < 1) throw std::invalid_argument("memory plan: world must be >= 1");
  if (in.stage < 0 || in.stage > 3) throw std::invalid_argument("memory plan: ZeRO stage must be 0, 1, 2 or 3");
  if (in.offload != "none" && in.offload != "cpu")
    throw std::invalid_argument("memory plan: offload must be none or cpu, got \"" + in.offload + "\"");
  if (in.zero3_prefetch < 0) throw std::invalid_argument("memory plan: zero3_prefetch must be >= 0");
  if (in.micro_batch < 1 || in.seq_len < 2)
    throw std::invalid_argument("memory plan: micro_batch >= 1, seq_len >= 2");
  if (in.checkpointing != "none" && in.checkpointing != "full" && in.checkpointing != "every_k")
    throw std::invalid_argument("memory plan: checkpointing must be none, full or every_k, got \"" +
                                in.checkpointing + "\"");
  if (in.checkpointing == "every_k" && in.checkpoint_every < 1)
    throw std::invalid_argument("memory plan: checkpoint_every must be >= 1");
  if (!(in.supervised_fraction >= 0 && in.supervised_fraction <= 1))
    throw std::invalid_argument("memory plan: supervised_fraction must be in [0, 1]");
  if (in.mod_kept_fraction <= 0 || in.mod_kept_fraction > 1)
    throw std::invalid_argument("memory plan: mod_kept_fraction must be in (0, 1]");
  if (!in.mod_kept_by_layer.empty() && in.mod_kept_by_layer.size() != in.mod_layers.size())
    throw std::invalid_argument("memory plan: mod_kept_by_layer needs one fraction per MoD layer");

  PlanShape s;
  s.e = elt(in.dtype, "dtype");
  s.fp32 = s.e == 4;
  s.B = in.micro_batch;
  s.L = in.seq_len;
  s.D = t.hidden_size;
  s.I = t.intermediate_size;
  s.V = t.vocab_size;
  s.H = t.num_attention_heads;
  s.Hkv = t.num_key_value_heads;
  s.Dh = t.dim_per_head();
  const int64_t r = elt(in.reduce_dtype, "reduce_dtype");

  MemoryPlan p;
  // ---- parameters and the trainable set (trainer/trainer.cpp freeze_and_count) ----
  const ParamCounts pc = count_params(in.model, in.mod_layers, in.mod_router);
  const std::set<int> frozen_layers = layer_set(in.frozen_llm_layers);
  int64_t trainable = 0;
  if (in.train_vision) trainable += pc.vision;
  // MGM's mining projectors train with frozen towers too (VisionTower::is_adapter; the optimize_vision_tower(_aux)
  // parts are not counted here).
  if (!in.train_vision && in.model.mgm && in.model.vision)
    trainable += mgm_mining_params(*in.model.mgm, in.model.vision->hidden_size);
  if (in.train_projector) trainable += pc.projector;
  if (in.train_llm) {
    trainable += pc.llm;
    for (int l : frozen_layers)
      if (l >= 0 && l < int(pc.llm_layer.size())) trainable -= pc.llm_layer[size_t(l)];
  }
  // LoRA (model/lora.h): A [r, in] + B [out, r] per adapted linear of every decoder layer not in freeze.llm_layers,
  // and the MoD routers (γ-MoD's shared one, or one [1, D] per MoD layer).
  const LoraLayerCounts lc = lora_layer_counts(t, in.lora_r, in.lora_targets);
  const int64_t lora_params = lc.params * t.num_hidden_layers;
  if (lora) {
    if (lc.linears == 0)
      throw std::invalid_argument("memory plan: lora.targets name none of q/k/v/o/gate/up/down_proj");
    for (int l = 0; l < t.num_hidden_layers; ++l)
      if (!frozen_layers.count(l)) trainable += lc.params;
    trainable += pc.shared_router;
    trainable += int64_t(in.mod_layers.size()) *
                 layer_costs(router_kind(in.mod_router, "memory plan: mod_router"), t.hidden_size).layer_router_params;
  }
  trainable -= std::min(trainable, in.frozen_by_groups);  // optimizer.groups with freeze
  if (trainable == 0) throw std::invalid_argument("memory plan: no trainable parameter");
  const int64_t N = in.world;
  const int64_t padded = (trainable + N - 1) / N * N;  // FlatParamLayout::padded_total
  const int64_t shard = padded / N;
  const int64_t local = in.stage == 0 ? trainable : shard;  // ShardedAdamW range
  p.params_total = pc.total() + lora_params;
  p.params_trainable = trainable;
  p.params_padded = padded;
  p.params_frozen = p.params_total - trainable;

  // ---- static terms (parallel/data_parallel.cpp constructor, parallel/sharded_adamw.cpp) ----
  const bool acc32 = in.accumulate_fp32 && !s.fp32;
  const int64_t src_e = acc32 ? 4 : s.e;  // dtype of the buffer the buckets reduce from
  const bool gshard_view = in.stage < 2 && src_e == 4 && r == 4;
  // ZeRO-2 (parallel/data_parallel.h): a bucket's gradient (+ fp32 accumulation) storage exists from the first
  // backward of a window that writes into it until its reduce-scatter in step(); none in the forward after a step.
  // ZeRO-3 (parallel/zero3_grads.h): a unit's gradient exists from its backward until its reduce-scatter; with
  // accumulation every unit's until the window's last backward (reduced once per step).
  const bool stage2_grads = in.stage >= 2, stage3 = in.stage == 3;
  const std::string grads_name = stage3 ? "gradients_zero3" : "gradients_zero2";
  const int64_t grad_elem_bytes = s.e + (acc32 ? 4 : 0);
  const bool offload = in.offload == "cpu", cuda = in.device == "cuda";
  // ZeRO-3 (parallel/zero3_driver.h, docs/parallel.md): the parameter shard in its dtype is the only static
  // parameter storage. The persistent units are gathered from the start of each micro-batch's forward to the end
  // of its backward (a term of every phase but the optimizer step); of the hooked units, `zero3_prefetch + 1`
  // are gathered at a time around a layer's forward or backward (or recompute), none at the loss; without
  // reshard-after-forward every hooked unit stays gathered from its forward to its backward.
  Zero3Units units = stage3 ? zero3_units(pc, in.model, in) : Zero3Units{};
  if (stage3) units.persistent = trainable - units.hooked;
  const bool reshard = in.zero3_reshard_after_forward;
  const int64_t z3_persistent = s.e * units.persistent;
  const int64_t z3_running = s.e * std::min<int64_t>(in.zero3_prefetch + 1, units.count) * units.max_unit;
  const int64_t z3_all_hooked = s.e * units.hooked;
  p.zero3_unit_params = units.max_unit;
  p.zero3_persistent_params = units.persistent;
  // A tower with its own cost model (tower_costs.h: Qwen2.5-VL) reports its pixels, tokens and activations.
  const std::unique_ptr<TowerCosts> tc = tower_costs(in.model);
  const int64_t images = in.model.vision || tc ? int64_t(in.images_per_sample) * s.B : 0;
  // AnyRes (LLaVA-NeXT): every image planned at the largest pinpoint, its base tile and whole grid through the tower.
  const AnyresBound anyres = anyres_image_bound(in.model);
  const int64_t img_px = tc                ? tc->pixel_elements(in.visual)
                         : in.model.vision ? 3 * int64_t(in.model.image_input_size()) * in.model.image_input_size() *
                                                 anyres.tiles
                                           : 0;
  if (in.model.anyres && images > 0 && int64_t(in.images_per_sample) * anyres.tokens > s.L)
    throw std::invalid_argument("memory plan: " + std::to_string(in.images_per_sample) +
                                " AnyRes image(s) of up to " + std::to_string(anyres.tokens) + " LLM tokens each (" +
                                std::to_string(anyres.tiles) + " tiles at the largest pinpoint) do not fit "
                                "data.max_len " + std::to_string(s.L));
  if (tc && images > 0 && int64_t(in.images_per_sample) * tc->llm_tokens(in.visual) > s.L)
    throw std::invalid_argument(
        "memory plan: " + std::to_string(in.images_per_sample) + " visual input(s) of " +
        std::to_string(tc->llm_tokens(in.visual)) + " LLM tokens each (max_pixels " +
        std::to_string(in.visual.max_pixels) + ", " + std::to_string(in.visual.frames) +
        " frame(s)) do not fit data.max_len " + std::to_string(s.L));
  std::vector<MemoryTerm> statics = {
      {"weights", s.e * (stage3 ? shard : padded),
       stage3 ? "ZeRO-3 parameter shard [P_pad / world] in the params' dtype (Zero3Params::shard)"
              : "trainable parameters: flat compute buffer pflat_ [padded P] (data_parallel.cpp)"},
      {"weights_frozen", s.e * p.params_frozen, "frozen parameters (vision tower etc.), compute dtype"},
      {"gradients", stage2_grads ? 0 : s.e * padded,
       stage2_grads ? "ZeRO-2/3: per-bucket/unit gradient storage, counted in the phases (released when reduced)"
                    : "flat gradient buffer gflat_ [padded P] in the parameters' dtype"},
      {"grad_accum_fp32", acc32 && !stage2_grads ? 4 * padded : 0, "accumulate_fp32: fp32 buffer gacc_ [padded P]"},
      {"reduced_grad_shard", gshard_view ? 0 : 4 * local,
       "gshard_: fp32 averaged gradient of this rank's range (a view of the flat buffer when fp32 stage "
       "0/1)"},
      {"optimizer_states", offload ? 0 : 12 * local,
       "fp32 master + exp_avg + exp_avg_sq over this rank's range (ShardedAdamW; offload: host memory)"},
      {"batch_inputs", s.B * s.L * (8 + 8 + 1 + 1) + images * img_px * (4 + (s.fp32 ? 0 : s.e)),
       "input_ids, labels (int64), attention mask, token roles, pixel values (fp32 + compute-dtype copy)"}};
  int64_t static_total = 0;
  for (const auto& x : statics) static_total += x.bytes;
  if (offload) {  // parallel/sharded_adamw.cpp with AdamWHyper::offload
    p.host_terms = {{"optimizer_states", 12 * local, "fp32 master + exp_avg + exp_avg_sq (pinned on CUDA)"},
                    {"grad_host_copy", cuda ? 4 * local : 0, "host copy of the fp32 gradient shard (CUDA only)"},
                    {"params_host_copy", cuda && !s.fp32 ? s.e * local : 0,
                     "the updated shard converted to the params' dtype before its host-to-device copy"}};
    for (const auto& x : p.host_terms) p.host_total += x.bytes;
  }
  if (in.async_checkpoint) {  // trainer/trainer_save.cpp: the snapshot arena of what this rank writes
    const int64_t weights = (s.e * p.params_total + N - 1) / N;  // split_model_by_bytes: about 1/N of the weights
    p.host_terms.push_back({"checkpoint_snapshot", weights + 12 * local,
                            "checkpoint.async: this rank's share of the weights + its optimizer shard, copied to host "
                            "for the background write (exactly sized, pinned on CUDA), kept from the first save for the later ones"});
    p.host_total += p.host_terms.back().bytes;
  }

  // ---- activations saved for backward (model/, mod/) ----
  const bool embed_trained = in.train_llm;
  // (A tower that projects itself, Qwen2.5-VL's merger, gives features that require grad only when it trains.)
  const bool proj_rg =
      images > 0 && (tc && tc->projector_params() == 0 ? in.train_vision
                                                        : in.train_projector || in.train_vision || in.model.mgm);
  bool rg = embed_trained || proj_rg;  // does the decoder input require grad
  int64_t act = 0;
  TowerActivations tower;             // trained LLaVA-HR towers (tower_activation_plan.h)
  act += 2 * s.e * s.B * s.L * s.Dh;  // rope cos/sin [B,L,Dh] (ForwardState, saved by apply_rotary)
  act += s.B * s.L;                   // image-token mask (masked_scatter)
  if (images > 0 && tc) {
    tower = tc->activations(images, in.visual, s.e, in.train_vision, in.checkpointing != "none");
    act += tower.saved;
  } else if (images > 0 && in.model.vision) {
    const ClipVisionConfig& v = *in.model.vision;
    const int64_t T = in.model.image_seq_length(), Dv = v.hidden_size;
    if (in.train_vision && in.model.multipath) {
      const ConvKernels kernels = in.device == "cuda"   ? ConvKernels::kCuda
                                  : in.cpu_bf16_onednn ? ConvKernels::kCpuOneDnn
                                                       : ConvKernels::kCpuAten;
      tower = multipath_tower_activations(in.model, images, s.e, in.checkpointing != "none", kernels);
      act += tower.saved;
    } else if (in.model.mgm) {
      act += mgm_tower_activations(in.model, images, s.e, in.train_vision, in.checkpointing != "none");
    } else if (in.train_vision) {
      const int run = in.model.vision_feature_layer >= 0
                          ? in.model.vision_feature_layer
                          : v.num_hidden_layers + 1 + in.model.vision_feature_layer;
      act += int64_t(run) * clip_layer_activations(images * anyres.tiles * v.tokens(), Dv, v.intermediate_size,
                                                   v.num_attention_heads, s.e);
    }
    if (proj_rg) {
      // projector: linear_1 input [N,T,Dv] (a copy: the CLS-dropping narrow is not contiguous), gelu input,
      // linear_2 input [N,T,D].
      act += s.e * images * anyres.tiles * T * (Dv + 2 * s.D);  // AnyRes: every tile's patches projected
    }
  }
  const std::set<int> mods = layer_set(in.mod_layers);
  const LayerCosts router_costs = layer_costs(router_kind(in.mod_router, "memory plan: mod_router"), s.D);
  auto kept = [&](double f) { return std::max<int64_t>(1, int64_t(std::llround(f * double(s.L)))); };
  std::map<int, int64_t> K_of;  // MoD layer -> tokens per sample it processes
  for (size_t i = 0; i < in.mod_layers.size(); ++i)
    K_of[in.mod_layers[i]] = kept(in.mod_kept_by_layer.empty() ? in.mod_kept_fraction : in.mod_kept_by_layer[i]);
  int64_t layers_full = 0, layers_ckpt = 0, max_layer = 0, max_transient = 0;
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    // LoRA (model/lora.cpp): the base weights are frozen (tw false); B saves A's output [T, r] per adapted
    // linear; A saves its input: without dropout the linear's input, shared by q/k/v (normed, [T, D]), by
    // gate/up ([T, D]), o_proj's [T, H Dh] and down_proj's [T, I]; with dropout each adapter's mask and
    // dropped input [T, in].
    const bool lora_layer = lora && !frozen_layers.count(l);
    const bool tw = in.train_llm && !frozen_layers.count(l);
    const bool is_mod = mods.count(l) > 0;
    const int64_t K = is_mod ? K_of.at(l) : s.L;
    int64_t a = is_mod ? mod_layer_saved(s, K, rg || lora_layer, tw, router_costs)
                       : dense_layer_saved(s, rg || lora_layer, tw);
    if (lora_layer) {
      const int64_t T = s.B * (is_mod ? K : s.L);
      a += s.e * T * in.lora_r * lc.linears;
      a += in.lora_dropout > 0 ? 2 * s.e * T * lc.inputs : s.e * T * lora_shared_inputs(t, in.lora_targets);
    }
    rg = rg || lora_layer;
    rg = rg || tw;
    const bool ckpt =
        in.checkpointing == "full" || (in.checkpointing == "every_k" && l % in.checkpoint_every == 0);
    layers_full += a;
    // A checkpointed layer keeps only its input [B,L,D] until its backward recomputes it.
    layers_ckpt += ckpt ? (rg ? s.e * s.B * s.L * s.D : 0) : a;
    if (ckpt) max_layer = std::max(max_layer, a);
    max_transient = std::max(max_transient, layer_backward_transient(s, is_mod ? K : s.L, tw));
  }
  // Label-only loss (model/lm_loss.cpp): N labelled rows, handled chunk rows at a time.
  const int64_t Nsup =
      std::max<int64_t>(0, std::llround(in.supervised_fraction * double(s.B) * double(s.L - 1)));
  const int64_t C = std::min<int64_t>(Nsup, lm_loss_chunk_rows(s.V));
  const bool head_tw = in.train_llm;
  const bool head_rg = rg || head_tw;
  int64_t head = norm_saved(s, s.L, rg, head_tw);  // final norm
  // The head node saves the labelled hidden rows [N,D], their targets [N] int64 and log-sum-exp [N] fp32;
  // index_select saves its index [N] int64 (when the hidden states require grad).
  if (head_rg) head += s.e * Nsup * s.D + 12 * Nsup + (rg ? 8 * Nsup : 0);
  // (the towers' part without checkpointing too)
  const int64_t tower_full =
      tower.saved <= 0 ? 0
      : tc ? tc->activations(images, in.visual, s.e, in.train_vision, false).saved - tower.saved
           : multipath_tower_activations(in.model, images, s.e, false, ConvKernels::kCuda).saved - tower.saved;
  p.activations_saved = act + tower_full + layers_full + head;
  const int64_t A = act + layers_ckpt + head;  // what is alive at the end of the forward

  // ---- head and loss (model/lm_loss.cpp HeadCrossEntropy), per chunk of C rows ----
  const int64_t CV = C * s.V;
  // Forward: fp32 logits and their log_softmax (bf16: the bf16 GEMM output next to its fp32 copy, before).
  const int64_t loss_fwd = std::max(8 * CV, s.fp32 ? 0 : (s.e + 4) * CV);
  // Backward: the hidden rows' gradient [N,D]; per chunk the recomputed logits (bf16: GEMM output + fp32
  // copy), softmax - onehot in place, its compute-dtype copy, the weight gradient (several chunks, bf16: an
  // fp32 accumulator and one chunk's product); then index_select's backward scatters into a [B,L,D] gradient
  // while the rows' gradient and the head weight's are still held by the engine.
  int64_t loss_bwd = 0;
  if (head_rg) {
    const int64_t VD = head_tw ? s.V * s.D : 0;
    const bool multi = Nsup > C;
    int64_t fn =
        s.fp32 ? 4 * CV + 4 * VD : std::max((s.e + 4) * CV, s.e * CV + s.e * VD) + (multi ? 4 * VD : 0);
    fn += (rg ? s.e * Nsup * s.D : 0);
    const int64_t after = rg ? s.e * s.B * s.L * s.D + s.e * Nsup * s.D + s.e * VD : 0;
    loss_bwd = std::max(fn, after);
  }

  // ---- gradient buckets in flight (data_parallel.cpp launch/finish_all, mpi_comm.cpp) ----
  // Per bucket element: the reduce-dtype copy (g.to(reduce_dtype)); MpiComm also upcasts bf16 to fp32 (MPI
  // has no bf16 sum). Per owned element (stage 2): Inflight::out, and MpiComm's receive buffer (fp32 when
  // upcast).
  if (in.device != "cpu" && in.device != "cuda")
    throw std::invalid_argument("memory plan: device must be cpu or cuda, got \"" + in.device + "\"");
  const bool mpi = in.device == "cpu";
  const int64_t per_elem = (src_e != r ? r : 0) + (mpi && r != 4 ? 4 : 0);
  // (Inflight::out is a view of the fp32 shard when the reduce dtype is fp32: no buffer of its own.)
  const int64_t per_owned = in.stage >= 2 ? (r == 4 ? 0 : r) + (mpi ? std::max<int64_t>(r, 4) : 0) : 0;
  // CUDA stage 2 (parallel/bucket_release.h): a bucket's gradient and its reduce-dtype copy (allocated on the
  // comm stream) are dropped once its reduce-scatter is enqueued; only Inflight::out stays until step().
  const bool cuda_release =
      release_bucket_at_launch(in.stage, c10::Device(in.device == "cuda" ? c10::kCUDA : c10::kCPU));
  const int64_t bucket = std::max<int64_t>(1, in.bucket_bytes / r);
  int64_t inflight = cuda_release ? per_owned * shard + (src_e != r ? r : 0) * std::min(padded, bucket)
                                  : per_elem * padded + per_owned * shard;
  // ZeRO-3 (parallel/zero3_grads.cpp, mpi_comm.cpp): a unit's reduction in flight holds what it reads (the
  // unit's gradient buffer, or its reduce-dtype copy), Inflight::out [owned] in the reduce dtype (never a
  // view of the shard) and, on MPI, the fp32 upcast of a bf16 reduction and the receive buffer [owned];
  // [owned] is the rank's block of the unit, min(U, S) on the rank that owns most of it (the plan is that
  // rank's; the others hold less). On MPI the backward starts the reduction of the unit above the running one
  // when it reaches the running one, and completes it at the running unit's first parameter gradient
  // (Zero3Driver::on_grad_ready; never earlier, whatever the peers' timing): without checkpointing that is
  // early in the layer's backward, before it peaks (no term); a checkpointed layer's parameter gradients all
  // come out of its node at the end of its recompute and backward, so the reduction is held through them
  // (counted). The end of the backward plans one. CUDA: the gradient is released when its reduce-scatter is
  // enqueued on the reduction stream (recordStream); the reduce-dtype copy and `out` remain until the next
  // poll.
  int64_t z3_inflight = 0;
  if (stage3) {
    const int64_t U = units.max_unit, own = std::min(U, shard);
    z3_inflight = mpi ? (src_e != r ? r : grad_elem_bytes) * U + (r != 4 ? 4 * U : 0) + r * own +
                            std::max<int64_t>(r, 4) * own
                      : r * own;  // (the reduce-dtype copy is freed, stream-ordered, when enqueued)
    if (mpi && N == 1) z3_inflight = 0;
    inflight = z3_inflight;
  }
  const int64_t z3_layer_inflight = mpi && in.checkpointing == "none" ? 0 : z3_inflight;
  // Bucket 0 (the last parameters, lm_head first) is launched as soon as its gradients are done and stays in
  // flight during the rest of the backward.
  int64_t first_bucket = 0;
  int64_t b0 = std::min<int64_t>(padded, std::max<int64_t>(bucket, in.train_llm ? pc.lm_head + s.D : bucket));
  if (b0 >= padded) b0 = 0;  // one bucket: launched at the end of the backward
  if (b0 > 0 && !stage3) first_bucket = (cuda_release ? 0 : per_elem * b0) + per_owned * std::min(b0, shard);
  // What the stage-2 buckets hold in the backward of the window's last micro-batch. CUDA with overlap and one
  // micro-batch: the buckets of at most one decoder layer wait for its last gradient (a bucket launches only
  // after the earlier ones), next to the bucket being filled; at the end the embedding's bucket, released at
  // once. Otherwise (MPI, earlier micro-batches' backwards, no overlap) every bucket (upper bound).
  int64_t zero2_layer = grad_elem_bytes * padded, zero2_end = grad_elem_bytes * padded;
  if (cuda_release && in.overlap_comm && in.grad_accum == 1) {
    int64_t max_layer_params = 0;
    for (int l = 0; l < int(pc.llm_layer.size()); ++l)
      if (in.train_llm && !frozen_layers.count(l))
        max_layer_params = std::max(max_layer_params, pc.llm_layer[size_t(l)]);
    zero2_layer = grad_elem_bytes * std::min(padded, max_layer_params + std::max(bucket, b0));
    zero2_end = grad_elem_bytes * std::min(padded, std::max(bucket, in.train_llm ? pc.embed : 0));
  }
  // ZeRO-3 with one micro-batch per step: the running unit's gradient and the persistent units' (attached at the
  // end of the forward, reduced once at the end of the backward; Zero3Driver::end_forward).
  const int64_t z3_persistent_grads = grad_elem_bytes * units.persistent;
  if (stage3 && in.grad_accum == 1) {
    zero2_layer = grad_elem_bytes * std::min(padded, units.max_unit + units.persistent);
    // (the first hooked unit's reduction starts at the end of the backward, with the persistent ones)
    zero2_end = grad_elem_bytes * std::min(padded, units.max_unit + units.persistent);
  }
  // ZeRO-3's gathered parameters per phase (see z3_persistent above).
  auto gathered = [&](std::vector<MemoryTerm>& terms, int64_t hooked, const char* what) {
    if (stage3)
      terms.push_back({"weights_gathered", z3_persistent + hooked,
                       std::string("ZeRO-3: the persistent units (embeddings, head, projector, norms, shared "
                                   "router) gathered for the micro-batch") +
                           what});
  };

  // ---- phases ----
  struct Phase {
    std::string name;
    std::vector<MemoryTerm> terms;
  };
  std::vector<Phase> phases;
  const std::string ckpt_note =
      in.checkpointing == "none" ? "" : " (checkpointed layers keep only their input)";
  const MemoryTerm act_term{"activations", A,
                            "tensors saved for backward at the end of the forward" + ckpt_note};
  {
    // End of forward: one chunk's logits and log_softmax, freed once its loss is summed.
    phases.push_back({"forward (loss)",
                      {act_term,
                       {"loss_transient", loss_fwd,
                        "one chunk's fp32 logits + log_softmax [C,V] (label-only loss, freed per chunk)"}}});
    if (stage2_grads && in.grad_accum > 1)
      phases.back().terms.push_back({grads_name, grad_elem_bytes * padded,
                                     "ZeRO-2/3 gradient buffers written by the window's earlier backwards"});
    gathered(phases.back().terms, reshard ? 0 : z3_all_hooked,
             reshard ? "" : ", every hooked unit (no reshard after forward)");
  }
  if (head_rg) {
    phases.push_back(
        {"loss backward",
         {act_term,
          {"loss_backward_transient", loss_bwd,
           "recomputed chunk logits, gradients of the labelled rows / hidden states / lm_head"}}});
    // ZeRO-2, one micro-batch: bucket 0 is allocated only when lm_head's gradient is accumulated, after these
    // transients are gone (measured), so no gradient storage counts here.
    if (stage2_grads && in.grad_accum > 1)
      phases.back().terms.push_back(
          {grads_name, grad_elem_bytes * padded, "ZeRO-2/3 gradient buffers (written by earlier backwards)"});
    if (stage3 && in.grad_accum == 1)
      phases.back().terms.push_back(
          {grads_name, z3_persistent_grads, "ZeRO-3 gradients of the persistent units (attached after the forward)"});
    gathered(phases.back().terms, reshard ? 0 : z3_all_hooked,
             reshard ? "" : ", every hooked unit (no reshard after forward)");
    // Layer backward: the last layers' saved tensors (all of them when nothing is checkpointed), a recomputed
    // layer, the gradient temporaries, and bucket 0 in flight.
    // The final norm and lm_head inputs are freed by then.
    std::vector<MemoryTerm> lt = {
        {"activations", A - head, "saved tensors of the decoder layers" + ckpt_note}};
    if (max_layer > 0)
      lt.push_back({"recomputed_layer", max_layer, "one checkpointed layer's activations, recomputed"});
    lt.push_back(
        {"layer_backward_transient", max_transient, "gradients inside one decoder layer's backward"});
    if (first_bucket > 0)
      lt.push_back({"comm_inflight", first_bucket, "gradient bucket 0 (lm_head) in flight"});
    if (z3_layer_inflight > 0)
      lt.push_back({"comm_inflight", z3_layer_inflight, "ZeRO-3: the previous unit's reduce-scatter in flight"});
    gathered(lt, reshard ? z3_running : z3_all_hooked,
             reshard ? ", zero3_prefetch + 1 hooked units of the largest size"
                     : ", the hooked units whose backward has not run (upper bound: all)");
    if (stage2_grads)  // upper bound: the buckets of the layers not yet reached are still unallocated
      lt.push_back({grads_name, zero2_layer,
                    stage3         ? "ZeRO-3 gradients of the running unit and the persistent units"
                    : cuda_release ? "ZeRO-2 gradient buckets not yet enqueued"
                                   : "ZeRO-2 gradient buckets (at most all)"});
    phases.push_back({"layer backward", lt});
    // Trained LLaVA-HR towers: their backward runs last (the decoder's tensors are gone) with what the tower
    // still holds, a recomputed unit and the gradients inside it, and (upper bound) every gradient bucket.
    if (tower.saved > 0) {
      std::string note =
          "the tower's saved tensors not yet released, a recomputed unit (CLIP layer / ConvNeXt stage) and the "
          "gradients inside its backward";
      if (in.device == "cpu" && s.e == 2)
        note += in.cpu_bf16_onednn ? " (bf16 convolutions on oneDNN, as on this CPU)"
                                   : " (bf16 convolutions on ATen's kernels, as on this CPU)";
      std::vector<MemoryTerm> tt = {{"tower_backward", tower.backward_peak, note}};
      if (first_bucket > 0)
        tt.push_back({"comm_inflight", first_bucket, "gradient bucket 0 (lm_head) in flight"});
      if (z3_layer_inflight > 0)
        tt.push_back({"comm_inflight", z3_layer_inflight, "ZeRO-3: the previous unit's reduce-scatter in flight"});
      gathered(tt, reshard ? z3_running : z3_all_hooked, ", the running and prefetched hooked units");
      if (stage2_grads)
        tt.push_back({grads_name, zero2_layer,
                      stage3 ? "ZeRO-3 gradients of the running unit and the persistent units"
                             : "ZeRO-2 gradient buckets (at most all)"});
      phases.push_back({"tower backward", tt});
    }
    // End of backward: every bucket in flight, the embedding's dense weight gradient.
    phases.push_back({"end of backward",
                      {{"comm_inflight", inflight,
                        "gradient buckets in flight (reduce-dtype copies, reduce-scatter buffers)"},
                       {"embedding_grad", embed_trained ? s.e * (s.V * s.D + s.B * s.L * s.D) : 0,
                        "dense embedding weight gradient before it is accumulated"}}});
    if (stage2_grads)
      phases.back().terms.push_back({grads_name, zero2_end,
                                     stage3 ? "ZeRO-3 gradients of the persistent units and the first hooked unit"
                                     : cuda_release
                                         ? "ZeRO-2: the last (embedding) bucket, released when enqueued"
                                         : "ZeRO-2 gradient buckets, all"});
    gathered(phases.back().terms, 0, "");
  }
  // Optimizer step: AdamW's denominator temporaries (2 chunks of at most 64 Mi elements, sharded_adamw.cpp).
  phases.push_back({"optimizer step",
                    {{"optimizer_transient", offload ? 0 : 8 * std::min<int64_t>(local, int64_t(64) << 20),
                      "AdamW sqrt/denominator temporaries (none offloaded: one in-place pass)"}}});

  size_t best = 0;
  for (size_t i = 0; i < phases.size(); ++i) {
    int64_t tot = static_total;
    for (const auto& x : phases[i].terms) tot += x.bytes;
    p.phases.push_back({phases[i].name, tot, phases[i].terms});
    if (tot > p.phases[best].bytes) best = i;
  }
  p.peak_phase = phases[best].name;
  p.total = p.phases[best].bytes;
  p.terms = statics;
  for (const auto& x : phases[best].terms) p.terms.push_back(x);

  // ---- communication per optimizer step (one reduction per step whatever grad_accum is) ----
  const double f = N > 1 ? double(N - 1) / double(N) : 0.0;
  if (stage3) {
    // Each micro-batch gathers every unit for its forward (the persistent ones once, for forward and backward)
    // and the hooked units again for their backward (or recompute), unless they stay gathered
    // (zero3_reshard_after_forward false); the gradients are reduce-scattered once per step, per unit. Units
    // hold no padding. 1.5x ZeRO-2's volume at the same dtypes when every parameter is in a hooked unit.
    const int64_t gf = int64_t(in.grad_accum) * s.e * trainable;
    const int64_t gb = reshard ? int64_t(in.grad_accum) * s.e * units.hooked : 0;
    p.comm.push_back({"all_gather(params, forward)", gf, "per unit before it runs, every micro-batch"});
    if (gb > 0)
      p.comm.push_back({"all_gather(params, backward)", gb, "per hooked unit before its backward or recompute"});
    p.comm.push_back({"reduce_scatter(gradients)", r * trainable, "per unit after its backward, reduce dtype"});
    p.comm_wire_bytes += f * double(gf + gb + r * trainable);
  } else if (in.stage < 2) {
    p.comm.push_back({"all_reduce(gradients)", r * padded, "bucketed, reduce dtype"});
    p.comm_wire_bytes += 2 * f * double(r * padded);
  } else {
    p.comm.push_back({"reduce_scatter(gradients)", r * padded, "bucketed, reduce dtype"});
    p.comm_wire_bytes += f * double(r * padded);
  }
  if (in.stage > 0 && !stage3) {
    p.comm.push_back(
        {"all_gather(parameters)", s.e * padded, "updated shards into every rank's flat buffer"});
    p.comm_wire_bytes += f * double(s.e * padded);
  }
  for (const auto& c : p.comm) p.comm_payload_bytes += c.bytes;
  // Reserved beyond `total` while reductions lag (MemoryPlan::cuda_reserved_lag_bytes): what the plan counts as
  // freed at enqueue, i.e. every bucket's (every unit's) gradient and its reduce-dtype copy of the window.
  if (cuda) {
    const int64_t copy_e = src_e != r ? r : 0;
    const int64_t freed_grads = stage3 ? grad_elem_bytes * trainable : cuda_release ? grad_elem_bytes * padded : 0;
    p.cuda_reserved_lag_bytes = freed_grads + copy_e * (stage3 ? trainable : padded);
  }

  p.budget_bytes = in.budget_bytes;
  p.reserve_bytes = in.reserve_bytes;
  p.has_budget = in.budget_bytes > 0;
  p.fits = !p.has_budget || double(p.total) + in.reserve_bytes <= in.budget_bytes;
  return p;
}

}  // namespace gmod

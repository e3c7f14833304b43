// The training run's configuration: plain structs with defaults, each field documented once here.
// read_train_config() is the one place that reads it: JSON file -> `--set key.path=value` overrides (typed by
// the existing field's type; 64-bit integers range-checked, floats finite: trainer/config/config_json.h) -> structs;
// validate_train_config() is the one place that checks it (ranges, combinations, files, the model's
// config.json), before any work, and reports every problem at once; read_valid_train_config() does both in
// one message. to_json() gives the effective config that is printed and saved with the run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mod/mod_config.h"
#include "model/lora_config.h"

namespace gmod {

struct ModelSection {
  // Either one combined Hugging Face model directory (LlavaForConditionalGeneration / original LLaVA /
  // LlamaForCausalLM: config.json + safetensors) ...
  std::string path;
  // ... or the parts LLaVA's stage 2 starts from (model/compose.h): an LLM directory (LlamaForCausalLM), a CLIP
  // vision directory (CLIPVisionModel or CLIPModel) and the stage-1 projector (mm_projector.bin written by
  // torch.save, or .safetensors; "" = random init, e.g. for stage 1). Exactly one of path and llm is set.
  std::string llm, vision, projector;
  int vision_feature_layer = -2;                          // parts only: CLIP layer whose features are projected
  std::string vision_feature_select_strategy = "default";  // parts only: "default" drops CLS, "full" keeps it
  // Parts only, LLaVA-HR (model/multipath_tower.h): the ConvNeXt of the slow path (a timm model directory with
  // config.json + model.safetensors, e.g. timm/convnext_large_mlp.clip_laion2b_ft_320) makes `vision` the fast CLIP
  // path of a multipath tower at input_image_size px; freeze_vision as LLaVA-HR's flag (false: the towers train
  // and the three stitch adapters exist; must equal freeze.vision).
  std::string vision_slow;
  int input_image_size = 1024;
  bool freeze_vision = true;
  // Parts only, Mini-Gemini (model/mgm_tower.h): the OpenCLIP ConvNeXt directory of the high-resolution path
  // makes `vision` MGM's low-resolution CLIP; MGM's image_size_aux, image_grid, image_global and its
  // optimize_vision_tower(_aux) flags (what trains with freeze.vision true, besides the mining projectors).
  std::string vision_aux;
  int image_size_aux = 768;
  int image_grid = 1;
  bool image_global = false;
  bool optimize_vision_tower = false;
  bool optimize_vision_tower_aux = false;
  // Parts only, LLaVA-NeXT (model/anyres_grid.h): AnyRes tiling with spatial_unpad and the learned image_newline,
  // the candidate resolutions as (height, width) pairs in transformers' order (the original LLaVA code lists them as
  // (width, height)); each side a multiple of the tower's image size. Empty: one image crop per image (LLaVA-1.5).
  std::vector<std::vector<int>> image_grid_pinpoints;
  std::string dtype = "fp32";    // compute/parameter dtype: "fp32" or "bf16" (optimizer keeps fp32 master weights)
  // "cpu", "cuda" (each rank takes GPU local_rank % device_count) or "cuda:N" (only with one rank per node)
  std::string device = "cpu";
  // "pretrained": load the weights from `path`; "random": only read config.json and initialise like transformers
  // with `init_seed` (demos and tests; identical on every rank).
  std::string init = "pretrained";
  uint64_t init_seed = 0;
  // Decoder layers that keep only their input during the forward and recompute their activations in the backward
  // (model/activation_checkpoint.h): "none", "full" (every layer) or "every_<k>" (layers whose index % k == 0, i.e.
  // 0, k, 2k, ...). Same gradients (bitwise in fp32), less activation memory, about one more forward per step.
  std::string activation_checkpointing = "none";
};

struct DataSection {
  std::string train;             // LLaVA instruction records: .json (list) or .jsonl
  std::string image_folder;      // image paths in the records are relative to it ("" = folder of `train`)
  std::string tokenizer;         // tokenizer.model / tokenizer.json or a directory holding one ("" = model.path)
  std::string template_name = "auto";  // conversation template (data/conversation.h); auto: the LLM family's
  int max_len = 2048;            // tokens per sample after image expansion (image tokens per image: model config)
  std::string truncation = "turn";  // "turn": keep whole leading rounds that fit; "skip": drop long samples
  // > 0: pack each micro-batch's samples into rows of at most this many tokens (>= max_len, so every sample fits;
  // data/pack.h): no compute on padding, the same loss and gradients. 0: rows padded to the longest sample.
  int64_t pack_to = 0;
  int workers = 2;               // loader threads per rank (0 = prepare inside the training thread)
  int prefetch = 4;              // micro-batches prepared ahead per rank
  // Unusable records (malformed, no answer, too long, bad image, ...) are skipped. The run stops before training when
  // none of the first `preflight_records` records of the sample order is usable or more than this fraction of them
  // is not (trainer/data_guard.h, the same verdict for any world size); later, each rank stops once more than this
  // fraction of the records it has seen (after 200) were unusable.
  double max_bad_fraction = 0.05;
  int64_t preflight_records = 256;  // records checked before training (-1: the whole dataset)
  // Decoded width x height per image, checked from the PNG/JPEG header before decoding (default 8192 x 8192).
  int64_t max_image_pixels = int64_t(8192) * 8192;
  bool group_by_modality_length = false;  // LLaVA's modality-grouped, length-sorted batches
  // > 0: if `train` does not exist, rank 0 first writes the synthetic demo dataset (data/demo_dataset.h) with
  // this many training records into the folder of `train` (which must then be named train.json/train.jsonl);
  // eval.data may then name <that folder>/heldout.json.
  int demo_records = 0;
};

struct EvalSection {
  std::string data;              // held-out records ("" = no evaluation)
  std::string image_folder;      // "" = data.image_folder
  int every = 0;                 // evaluate every N optimizer steps (0 = only at the end, when `data` is set)
  int max_batches = 8;           // micro-batches per rank per evaluation (0 = the whole set)
  // Also greedy-generate each sample's first answer from its prompt and report the exact-match rate (model in eval
  // mode: MoD layers route by threshold, as at inference).
  bool exact_match = true;
};

// One entry of optimizer.groups (docs/training.md "Per-part learning rates and freezing"): the parameters it
// selects (any of its parts, glob patterns or regexes matches; the first group that matches a parameter takes
// it) and what they get. trainer/config/param_groups.h reads, checks and resolves them.
struct ParamGroupConfig {
  std::string name;                       // in logs, metrics (lr_groups) and checkpoints ("" = "group<i>")
  // projector | vision_tower | vision_adapters | llm | routers | lora (param_groups.h: param_part)
  std::vector<std::string> parts;
  std::vector<std::string> params;        // glob patterns on full parameter names (* ? [...], fnmatch)
  std::vector<std::string> params_regex;  // ECMAScript regexes, searched in the full parameter name
  double lr = -1;                         // peak learning rate (< 0: optimizer.lr); the schedule scales it
  double weight_decay = -1;               // < 0: optimizer.weight_decay (optimizer.no_decay still applies)
  bool freeze = false;                    // the matched parameters do not train: no gradient, no optimizer state
};

struct OptimizerSection {
  double lr = 2e-5;              // peak learning rate
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;     // decoupled (AdamW), on every trainable parameter not matched by no_decay
  // Parameters whose name contains any of these substrings get no weight decay. Default as HF Trainer / LLaVA:
  // biases and every LayerNorm/RMSNorm weight ("norm" matches layernorm, layer_norm, pre_layrnorm, model.norm).
  // [] = decay every trainable parameter.
  std::vector<std::string> no_decay = {"bias", "norm"};
  double warmup_ratio = 0.03;    // linear warmup over ceil(ratio * total_steps) steps, unless warmup_steps > 0
  int warmup_steps = 0;
  double min_lr = 0.0;           // cosine decay ends here
  double max_grad_norm = 1.0;    // global-norm clipping (<= 0: off)
  int zero_stage = 1;            // 0: replicated AdamW; 1: sharded optimizer state; 2: + reduce-scattered gradients;
                                 // 3: + parameters sharded in units, gathered around each unit (docs/parallel.md)
  int zero3_prefetch = 1;        // stage 3: units gathered ahead of the one running (0..8; memory: +1 unit each)
  int bucket_mb = 25;            // gradient communication bucket size
  // Gradient communication dtype: "fp32" (default; bf16 gradients are upcast per bucket), "bf16" (half the traffic,
  // averages rounded to bf16), or "param" (= model.dtype: no conversion).
  std::string reduce_dtype = "fp32";
  bool overlap_comm = true;      // start bucket reductions during the last micro-batch's backward (bitwise same result)
  // bf16 params: accumulate micro-batch gradients in an fp32 buffer (+4 bytes/param until the reduction) instead of
  // the bf16 .grad; no effect with fp32 params.
  bool accumulate_fp32 = false;
  // "cpu": fp32 master + Adam moments of this rank's shard in (pinned) host memory, the AdamW update on CPU threads,
  // the updated shard copied back to the device; bitwise the same training as "none" (docs/parallel.md).
  std::string offload = "none";
  // Per-part learning rates, weight decay and freezing (ParamGroupConfig above); unmatched trainable parameters use
  // lr and weight_decay above. [] = one group.
  std::vector<ParamGroupConfig> groups;
  // Shorthands as LLaVA's and LLaVA-NeXT's flags (0 = unset): a group {"parts": ["projector"], "lr": x} named
  // mm_projector_lr, and {"parts": ["vision_tower"], "lr": x} named mm_vision_tower_lr, after `groups`.
  double mm_projector_lr = 0.0;
  double mm_vision_tower_lr = 0.0;
  // Stage 3: release each unit's gathered parameters after its forward and gather them again for its backward
  // (true, FSDP's reshard_after_forward); false keeps them from the forward to the backward (no second gather,
  // every unit held at the end of the forward).
  bool zero3_reshard_after_forward = true;
};

struct BatchSection {
  int micro_batch = 1;           // samples per rank per forward/backward
  int grad_accum = 1;            // micro-batches per optimizer step (ignored when global_batch > 0)
  // > 0: samples per optimizer step over all ranks; grad_accum = global_batch / (world * micro_batch). Keep it
  // fixed to resume at another world size with the same data order and loss.
  int global_batch = 0;
};

struct ScheduleSection {
  int epochs = 1;                // passes over the training set (used when max_steps = 0)
  int max_steps = 0;             // optimizer steps in the whole run (> 0 overrides epochs); sets the LR horizon
  // > 0: stop after this global step (checkpoint, exit 0) without changing the LR horizon, e.g. for time-limited
  // jobs that resume later.
  int exit_at_step = 0;
};

struct FreezeSection {
  bool vision = true;            // CLIP tower frozen (LLaVA default)
  bool projector = false;
  bool llm = false;              // the whole LLM (embeddings, layers, norm, LM head, MoD routers)
  std::vector<std::string> llm_layers;  // frozen decoder layer ranges, e.g. ["0-3", "7"]
};

struct ModSection {
  bool enabled = false;          // convert the model to Mixture-of-Depths before training
  // How the MoD layers are chosen (mod/conversion.h): "arank_mod", "layers:3,4,5", "threshold:110", "keep_top:4"
  // (the last two first run ARank on the first `arank_samples` training samples, rank 0, written to <run>/arank.json).
  // Ignored when config.mod_layers_idx is non-empty.
  std::string rule = "arank_mod";
  int arank_samples = 50;
  // Which samples ARank measures (data/arank_samples.h): "paper" = γ-MoD's protocol, the first arank_samples image
  // samples of a seeded shuffle of data.train, each cut to its first prompt (no answer), prefill; "training" = the
  // first arank_samples samples of the training order as trained on (whole conversations, text-only included).
  std::string arank_protocol = "paper";
  // Router, capacity, masks, λ (= router_aux_loss_coef: loss = LM + λ Σ_l routing loss_l); see mod/mod_config.h.
  MoDConfig config;
};

struct CheckpointSection {
  int every = 0;                 // save every N optimizer steps (0 = only at the end / on a signal)
  int keep_last = 3;             // complete checkpoints kept (>= 2, or 0 = all)
  // Write in the background while training continues (trainer/checkpoint/async_save.h): the step's state is
  // copied to host memory (pinned on CUDA; `gmod plan` states the bytes) and committed once every rank has written.
  bool async = false;
};

struct MetricsSection {
  int log_every = 1;             // metrics.jsonl line + progress update every N steps
  // Peak FLOP/s per rank for MFU, in TFLOP/s. 0 = default: 989 (CUDA bf16, H100/H200 dense), 67 (CUDA fp32),
  // 1.0 on CPU (a nominal figure; CPU MFU is only comparable with itself).
  double peak_tflops = 0.0;
  bool log_sample_ids = false;   // <run>/samples/rank-<r>.txt: "step micro idx..." per micro-batch (tests, audits)
  // <run>/tensorboard/events.out.tfevents.*: every metrics line and evaluation as TensorBoard scalars (rank 0;
  // trainer/tensorboard_events.h).
  bool tensorboard = false;
  // "A-B": a Chrome/Perfetto trace of steps A..B per rank in <run>/profile/ (trainer/step_profiler.h); "" = none.
  std::string profile_steps;
};

struct ParallelSection {
  // Deadline of every collective and the longest a rank may go without a heartbeat; past it the job is aborted
  // naming the collective, the step and the missing ranks (parallel/watchdog.h).
  double timeout_s = 600.0;
  // Named phases where the other ranks legitimately wait longer than timeout_s for rank 0 get their own deadline
  // (parallel/watchdog.h PhaseDeadline); a timeout in one names the phase and its key.
  double arank_timeout_s = 3600.0;         // ARank on rank 0 (mod.rule needing it), the others wait for its result
  double resume_check_timeout_s = 3600.0;  // rank 0 verifies the CRCs of the checkpoint to resume from
  double save_timeout_s = 3600.0;          // a checkpoint save: rank 0 writes model.h5 and applies retention
};

struct TrainConfig {
  ModelSection model;
  DataSection data;
  EvalSection eval;
  OptimizerSection optimizer;
  BatchSection batch;
  ScheduleSection schedule;
  FreezeSection freeze;
  ModSection mod;
  CheckpointSection checkpoint;
  MetricsSection metrics;
  ParallelSection parallel;
  uint64_t seed = 42;            // data order; each rank's generator is seeded from (seed, rank)
  // Deterministic algorithms; on CPU, same world size and thread count => bitwise-identical runs and resumes.
  bool deterministic = false;
  std::string run_dir = "runs/default";  // metrics.jsonl, config.json, checkpoints/
  // "auto": the newest valid checkpoint of run_dir, or from scratch when there is none; when checkpoints exist but
  // none verifies it refuses to start (they are kept). "auto_or_scratch": the same, but then starts from scratch
  // (the corrupt ones are kept as step-<N>.corrupt). "none": from scratch. Or a step directory.
  std::string resume = "auto";
  // Resume even when seed, data.train (path or record count), grouping, template, max_len, micro/global batch or
  // the model's files differ from the checkpoint's (the sample order then no longer continues exactly).
  bool resume_allow_changes = false;
  int max_consecutive_skipped = 10;  // non-finite-gradient steps in a row before the run is aborted
  // LoRA adapters on the LLM's linears (model/lora.h, docs/lora.md); r = 0: none. With r > 0 the LLM's own weights
  // are frozen (held in model.dtype, no master copy, no optimizer state), adapters and MoD routers train.
  LoraConfig lora;
};

nlohmann::json to_json(const TrainConfig& c);
// Reads the JSON file (may be "" = defaults only), applies overrides ("a.b=value"), converts. Throws
// std::invalid_argument listing every unknown key, wrong type, out-of-range integer, non-finite float and
// unparsable override. With `problems`, appends them there instead and returns the config with those values
// at their defaults (an unreadable file or invalid JSON still throws).
TrainConfig read_train_config(const std::string& path, const std::vector<std::string>& overrides = {},
                              std::vector<std::string>* problems = nullptr);
// The same from an already parsed JSON object (`source` names it in messages).
TrainConfig train_config_from_json(const nlohmann::json& j, const std::vector<std::string>& overrides = {},
                                   const std::string& source = "config",
                                   std::vector<std::string>* problems = nullptr);
// read_train_config + check_train_config: every reading and validation problem of the file in one
// std::invalid_argument that names `path` (validation messages about keys that could not be read are left
// out).
TrainConfig read_valid_train_config(const std::string& path, const std::vector<std::string>& overrides,
                                    int world, int ranks_on_node = 1);
// Every problem of `c` for a job of `world` ranks, `ranks_on_node` of them on this node (impossible
// combinations, values out of range, non-finite floats, missing files, the model's own config.json problems
// and settings that do not fit the model: data.max_len beyond its positions, layers it does not have), one
// per entry, key first.
std::vector<std::string> check_train_config(const TrainConfig& c, int world, int ranks_on_node = 1);
// Throws std::invalid_argument listing everything check_train_config found.
void validate_train_config(const TrainConfig& c, int world, int ranks_on_node = 1);
// The settings of `c` that must fit the model `m` (named `model` in messages): data.max_len <= its
// max_position_embeddings, freeze.llm_layers and MoD layers among its decoder layers.
struct LlavaConfig;
std::vector<std::string> check_config_fits_model(const TrainConfig& c, const LlavaConfig& m,
                                                 const std::string& model);
// model.device: "cpu", "cuda" (index -1) or "cuda:N" (index N); false for anything else.
bool parse_device(const std::string& s, int* index);

// optimizer.reduce_dtype with "param" resolved to model.dtype: "fp32" or "bf16".
std::string effective_reduce_dtype(const TrainConfig& c);

// True when optimizer.weight_decay applies to the parameter `name` (it contains none of `no_decay`).
bool decays_weight(const std::string& name, const std::vector<std::string>& no_decay);

// Micro-batches per optimizer step for this world size.
int grad_accum_steps(const TrainConfig& c, int world);
// "0-3" / "7" ranges -> sorted unique layer indices; throws std::invalid_argument on bad syntax and on an
// index
// >= num_layers (the model's decoder layers), checked before anything is expanded. num_layers < 0 (model not
// known yet): indices up to kMaxLayerIndex.
inline constexpr int kMaxLayerIndex = 65535;
std::vector<int> parse_layer_ranges(const std::vector<std::string>& ranges, int num_layers = -1);

}  // namespace gmod

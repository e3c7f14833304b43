#include "trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "data/arank_samples.h"
#include "data/demo_dataset.h"
#include "data/model_data.h"
#include "mod/arank.h"
#include "mod/conversion.h"
#include "mod/method_registry.h"
#include "mod/token_selection.h"
#include "model/config.h"
#include "model/lm_loss.h"
#include "model/pretrained.h"
#include "model/trace_range.h"
#include "parallel/sharded_adamw.h"
#include "parallel/watchdog.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data_guard.h"
#include "trainer/deterministic_check.h"
#include "trainer/fault_injection.h"
#include "trainer/model_setup.h"
#include "trainer/param_freeze.h"
#include "trainer/peak_flops.h"
#include "trainer/shared_lengths.h"
#include "trainer/step_stats.h"

namespace gmod {
namespace {
// k_max of this batch's MoD capacity plan (every MoD layer has the same config, so one plan for all): with it
// the FLOP accounting credits the B x k_max rows each MoD layer computes (mod/accounting.h). -1: no MoD
// layer, or layers that route by threshold (their counts are data-dependent).
int64_t capacity_kmax(const MultimodalLM& model, const at::Tensor& host_role_counts) {
  const auto layers = mod_layers(model);
  if (layers.empty() || !host_role_counts.defined()) return -1;
  const MoDDecoderLayer& l = *layers.front();
  return l.method->shared_kmax(l, host_role_counts);  // mod/token_selection.h
}

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Taken while the process starts (static initialisation, before main and MPI): the origin of "first step at".
const Clock::time_point process_start = Clock::now();

void on_stop_signal(int) { stop_signal_flag().store(true); }

// Supervised positions after the shift of the causal LM loss (labels[:, 1:] != -100).
int64_t supervised_count(const at::Tensor& labels) {
  if (!labels.defined() || labels.size(1) < 2) return 0;
  return labels.slice(1, 1).ne(-100).sum().item<int64_t>();
}

}  // namespace

uint64_t rank_seed(uint64_t seed, int64_t step, int rank) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + uint64_t(step) * 0xBF58476D1CE4E5B9ull + uint64_t(rank) + 1;
  x ^= x >> 31;
  return x * 0x94D049BB133111EBull;
}

std::atomic<bool>& stop_signal_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // set-up reads files: an interrupted read must resume, not fail
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

Trainer::Trainer(RunPlan plan, std::shared_ptr<Comm> comm)
    : plan_(std::move(plan)), cfg_(plan_.config), comm_(std::move(comm)) {
  rank_ = comm_->rank();
  world_ = comm_->world_size();
  if (plan_.world != world_)
    throw std::logic_error("Trainer: the run plan was resolved for " + std::to_string(plan_.world) +
                           " rank(s), the job has " + std::to_string(world_));
  if (const FaultInjection& fi = FaultInjection::from_env(); !fi.empty())  // test facility, docs/training.md
    print("warning: fault injection (" + std::string(FaultInjection::kEnv) + "): " + fi.describe());
  device_ = comm_->device();
  dtype_ = plan_.dtype;
  accum_ = plan_.grad_accum;
  global_batch_ = plan_.global_batch;

  if (cfg_.deterministic) {
    if (device_.is_cuda()) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  at::manual_seed(rank_seed(cfg_.seed, 0, rank_));

  // Before anything is written to run_dir: its lock (a second job stops here) and the checkpoint to resume from.
  if (rank_ == 0) run_lock_ = std::make_unique<RunDirLock>(cfg_.run_dir);
  choose_resume();
  if (rank_ == 0) {
    fs::create_directories(cfg_.run_dir);
    std::ofstream(fs::path(cfg_.run_dir) / "config.json") << to_json(cfg_).dump(2) << "\n";
  }
  load_model();
  setup_data();
  if (cfg_.mod.enabled) convert_model();
  model_->to(device_, dtype_);  // new router parameters
  if (cfg_.lora.enabled()) {  // after the MoD conversion, as γ-MoD's train.py (docs/lora.md)
    const LoraAttachment att = attach_run_lora(*model_, cfg_);
    att.stream->seed = rank_seed(cfg_.seed, 0, rank_) ^ 0x4C6F5241ull;  // dropout masks: per rank, per pass
    char alpha[32];
    std::snprintf(alpha, sizeof alpha, "%g", cfg_.lora.alpha);  // 16, not 16.000000
    print("lora: r " + std::to_string(cfg_.lora.r) + ", alpha " + alpha + " on " +
          std::to_string(att.modules.size()) + " linear layers, " + std::to_string(att.parameters) +
          " adapter parameters");
  }
  model_->train();
  model_->llm->activation_checkpointing = plan_.checkpointing;
  // The tower's own units (CLIP layers, ConvNeXt stages) are checkpointed whenever decoder layers are.
  if (model_->vision) model_->vision->set_activation_checkpointing(model_->llm->activation_checkpointing.enabled());
  freeze_and_count();
  if (cfg_.deterministic && device_.is_cuda()) {  // trainer/deterministic_check.h: refuse now, not mid-step
    std::vector<DeterministicUse> uses;
    if (model_->vision)
      uses.push_back({model_->vision->differentiated_bilinear_resize(), "bilinear resize backward",
                      bilinear_backward_runs(device_)});
    const auto& mc = cfg_.mod.config;
    if (cfg_.mod.enabled)  // the method's own (mod/token_selection.h)
      if (const auto u = method_for(mc.router).deterministic_use(mc); !u.site.empty())
        uses.push_back({u.site, u.op, deterministic_op_runs(u.op, device_), u.remedy});
    if (const std::string e = deterministic_conflicts(uses); !e.empty()) throw std::invalid_argument(e);
  }
  setup_optimizer();
  resume_if_requested();
  if (cfg_.checkpoint.async && cfg_.checkpoint.every > 0) reserve_snapshot();
  LoaderConfig lc{cfg_.batch.micro_batch, rank_, world_,
                  SamplerConfig{cfg_.seed, global_batch_, cfg_.data.group_by_modality_length, 0},
                  cfg_.data.workers, cfg_.data.prefetch, -1, cfg_.data.max_bad_fraction, 200, true, device_.is_cuda()};
  lc.pack_to = cfg_.data.pack_to;
  loader_ = std::make_unique<DataLoader>(*train_set_, lc, start_position_);
  const int64_t steps_per_epoch = loader_->micro_steps_per_epoch() / accum_;
  if (steps_per_epoch < 1)
    throw std::invalid_argument("data.train: " + std::to_string(train_set_->size()) +
                                " records are fewer than one global batch (" + std::to_string(global_batch_) + ")");
  total_steps_ = cfg_.schedule.max_steps > 0 ? cfg_.schedule.max_steps : int64_t(cfg_.schedule.epochs) * steps_per_epoch;
  const int64_t warmup = cfg_.optimizer.warmup_steps > 0
                             ? cfg_.optimizer.warmup_steps
                             : int64_t(std::ceil(cfg_.optimizer.warmup_ratio * double(total_steps_)));
  sched_ = std::make_unique<LRSchedule>(cfg_.optimizer.lr, cfg_.optimizer.min_lr, warmup, total_steps_);
  if (!saved_schedule_.is_null()) {
    const std::string diff = sched_->load_state(saved_schedule_);
    if (!diff.empty()) print("warning: " + diff);
  }
  const double peak_per_rank =
      cfg_.metrics.peak_tflops > 0 ? cfg_.metrics.peak_tflops : default_peak_tflops(device_, dtype_);
  if (peak_per_rank <= 0)
    print("warning: no peak FLOP/s known for " + device_.str() + " (" + cuda_device_name(device_.index()) +
          "): mfu is reported as 0; set metrics.peak_tflops (TFLOP/s per GPU, trainer/peak_flops.cpp has the "
          "table)");
  const double peak = world_ * 1e12 * peak_per_rank;
  logger_ = std::make_unique<MetricsLogger>(cfg_.run_dir, rank_ == 0, peak, step_);
  if (cfg_.metrics.tensorboard) logger_->write_tensorboard((fs::path(cfg_.run_dir) / "tensorboard").string(), step_);
  const StepRange& profiled = plan_.profile_steps;
  if (!profiled.empty())
    profiler_ = std::make_unique<StepProfiler>(profiled, cfg_.run_dir, rank_, device_.is_cuda(),
                                               [this](const std::string& s) { print(s); });
  print("data: " + std::to_string(train_set_->size()) + " records, global batch " + std::to_string(global_batch_) +
        " = " + std::to_string(world_) + " ranks x " + std::to_string(cfg_.batch.micro_batch) + " x " +
        std::to_string(accum_) + " accumulation; " + std::to_string(steps_per_epoch) + " steps/epoch, " +
        std::to_string(total_steps_) + " steps in total, warmup " + std::to_string(sched_->warmup_steps()));
}

Trainer::~Trainer() = default;

void Trainer::print(const std::string& msg) const {
  if (rank_ != 0) return;
  if (logger_) logger_->print(msg);
  else std::cout << msg << std::endl;
}

void Trainer::load_model() {
  const auto t0 = Clock::now();
  model_ = load_run_model(cfg_.model, dtype_);
  model_->to(device_, dtype_);
  model_load_s_ = seconds_since(t0);
}

void Trainer::convert_model() {
  const MoDConfig mc = convert_for_run(*model_, cfg_.mod, [this] {
    const std::vector<double> arank = run_arank();
    std::ostringstream os;
    for (size_t i = 0; i < arank.size(); ++i) os << (i ? " " : "") << arank[i];
    print("arank per layer: " + os.str());
    return arank;
  });
  cfg_.mod.config = mc;
  mod_layers_ = mc.mod_layers;
}

std::vector<double> Trainer::run_arank() {
  // On rank 0, on the samples mod.arank_protocol names; the result is broadcast so that
  // every rank converts the same layers. The others wait in that broadcast for as long as rank 0 measures: a phase
  // with its own deadline (thousands of SVDs at 7B take far longer than parallel.timeout_s).
  const PhaseDeadline phase("ARank on rank 0 (the other ranks wait for its result)", "parallel.arank_timeout_s",
                            cfg_.parallel.arank_timeout_s);
  const int n_layers = model_->config.text.num_hidden_layers;
  at::Tensor means = at::zeros({n_layers}, at::TensorOptions().dtype(at::kDouble));
  if (rank_ == 0) {
    std::vector<ModelInputs> batches;
    if (cfg_.mod.arank_protocol == "paper") {
      // A seeded shuffle (not the first records of the file, which are often one source) of the training set.
      const at::Tensor perm =
          at::randperm(int64_t(train_set_->size()), at::make_generator<at::CPUGeneratorImpl>(cfg_.seed),
                       at::TensorOptions().dtype(at::kLong));
      std::vector<size_t> order(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + perm.numel());
      ARankSampling sampling;
      sampling.samples = cfg_.mod.arank_samples;
      sampling.batch = cfg_.batch.micro_batch;
      ARankSamplingStats stats;
      for (const Batch& b : arank_batches(*train_set_, order, sampling, stats)) {
        ModelInputs in = to_model_inputs(b, device_);
        if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(dtype_);
        if (in.pixel_values_videos.defined()) in.pixel_values_videos = in.pixel_values_videos.to(dtype_);
        batches.push_back(in);
      }
      print("arank: " + stats.summary() + " with images from data.train, first prompts up to the assistant turn "
            "(γ-MoD's protocol)");
    } else {
      const int mb = cfg_.batch.micro_batch;
      DataLoader loader(*train_set_, LoaderConfig{mb, 0, 1, SamplerConfig{cfg_.seed, mb, false, 0}, 0, 1, -1, 1.0,
                                                  200, true});
      // At most one pass over the data (no sample measured twice); none usable is a named error.
      int64_t n = 0, seen = 0;
      while (n < cfg_.mod.arank_samples && seen < int64_t(train_set_->size())) {
        Batch b = loader.next();
        seen += b.size() + int64_t(b.skipped.size());
        n += b.size();
        if (b.empty()) continue;
        ModelInputs in = to_model_inputs(b, device_);
        if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(dtype_);
        if (in.pixel_values_videos.defined()) in.pixel_values_videos = in.pixel_values_videos.to(dtype_);
        batches.push_back(in);
      }
      if (n == 0)
        throw std::runtime_error("arank: " + cfg_.data.train + ": no usable sample among " + std::to_string(seen) +
                                 " records");
    }
    inject_arank_delay(rank_);  // GMOD_FAULT_INJECT slow_arank only (a test facility)
    ARankOptions o;
    o.max_samples = cfg_.mod.arank_samples;
    const ARankResult r = compute_arank(*model_, batches, o);
    const auto v = r.means();
    for (size_t i = 0; i < v.size() && int(i) < n_layers; ++i) means[int64_t(i)] = v[i];
    write_arank_json(r, (fs::path(cfg_.run_dir) / "arank.json").string());
  }
  at::Tensor t = means.to(device_);
  comm_->broadcast(t, 0);
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + n_layers);
}

void Trainer::freeze_and_count() {
  const int n_layers = model_->config.text.num_hidden_layers;
  const auto frozen_layers = parse_layer_ranges(cfg_.freeze.llm_layers, n_layers);
  int64_t total = 0, trainable = 0;
  // freeze.*, then optimizer.groups may freeze more and gives each trainable parameter its group
  // (trainer/param_freeze.h).
  const std::vector<ParamGroupInput> inputs = param_group_inputs(*model_, cfg_);
  std::vector<at::Tensor> tensors;
  for (auto& item : model_->named_parameters()) tensors.push_back(item.value());
  param_groups_ = resolve_param_groups(cfg_.optimizer, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool frozen = param_groups_.group_of[i] < 0;
    tensors[i].set_requires_grad(!frozen);
    total += inputs[i].numel;
    if (!frozen) {
      trainable_.emplace_back(inputs[i].name, tensors[i]);
      trainable_group_.push_back(param_groups_.group_of[i]);
      trainable += inputs[i].numel;
    }
  }
  if (!frozen_layers.empty() && frozen_layers.back() >= n_layers)
    throw std::invalid_argument("freeze.llm_layers: layer " + std::to_string(frozen_layers.back()) +
                                " does not exist (the model has " + std::to_string(n_layers) + ")");
  if (trainable_.empty()) throw std::invalid_argument("freeze: no trainable parameter left");
  flop_parts_ = TrainableParts::of(*model_, n_layers, model_->config.text.tie_word_embeddings);
  std::string mods;
  for (int l : mod_layers_) mods += (mods.empty() ? "" : ",") + std::to_string(l);
  print("model: " + describe_model_source(cfg_.model) + " (" + cfg_.model.init + "), " + std::to_string(total) + " parameters, " +
        std::to_string(trainable) + " trainable, " + cfg_.model.dtype + " on " + device_.str() +
        (cfg_.mod.enabled ? ", MoD layers [" + mods + "] (" + cfg_.mod.config.selection + ")" : ", dense") +
        (model_->llm->activation_checkpointing.enabled()
             ? ", activation checkpointing " + model_->llm->activation_checkpointing.to_string()
             : ""));
}

void Trainer::setup_data() {
  // Demo data on request: rank 0 writes it once, everyone waits. Rank 0 decides for all: had each rank looked for
  // the file itself, a rank that looked after rank 0 had written it would skip the barrier the others are in.
  const bool write_demo =
      cfg_.data.demo_records > 0 &&
      comm_->all_reduce(rank_ == 0 && !fs::exists(cfg_.data.train) ? 1.0 : 0.0, ReduceOp::Max) > 0;
  if (write_demo) {
    if (rank_ == 0) {
      DemoDatasetOptions d;
      d.num_train = cfg_.data.demo_records;
      d.num_heldout = std::max(8, cfg_.data.demo_records / 4);
      d.seed = cfg_.seed;
      make_demo_dataset(fs::path(cfg_.data.train).parent_path().string(), d);
      print("data: wrote the demo dataset to " + fs::path(cfg_.data.train).parent_path().string());
    }
    comm_->barrier();
  }
  tokenizer_ = load_tokenizer(cfg_.data.tokenizer.empty() ? default_tokenizer_source(cfg_.model) : cfg_.data.tokenizer);
  if (tokenizer_->vocab_size() > model_->config.text.vocab_size)
    throw std::invalid_argument("data.tokenizer: vocabulary of " + std::to_string(tokenizer_->vocab_size()) +
                                " ids does not fit the model's vocab_size " +
                                std::to_string(model_->config.text.vocab_size));
  DatasetConfig dc;
  dc.data_path = cfg_.data.train;
  dc.image_folder =
      cfg_.data.image_folder.empty() ? fs::path(cfg_.data.train).parent_path().string() : cfg_.data.image_folder;
  // "auto" -> the LLM family's template; resolved in cfg_ so checkpoints record (and resume compares) the one used.
  cfg_.data.template_name = resolve_conversation_template(cfg_.data.template_name, model_->config.text);
  dc.conversation.template_name = cfg_.data.template_name;
  dc.sample.max_len = cfg_.data.max_len;
  dc.sample.truncation = parse_truncation_mode(cfg_.data.truncation);
  dc.max_image_pixels = cfg_.data.max_image_pixels;
  // The image token, preprocessing and the image / video preparers, as every command decides them
  // (data/model_data.h).
  configure_for_model(dc, model_->config, preprocessor_source(cfg_.model), tokenizer_);
  auto t0 = Clock::now();
  train_set_ = std::make_unique<Dataset>(dc, tokenizer_);
  data_index_s_ = seconds_since(t0);
  // Grouping by modality length: the lengths once for the whole job (parsed split over the ranks, or read from the
  // cache), before the guard and the loader ask for them.
  if (cfg_.data.group_by_modality_length) {
    t0 = Clock::now();
    const SharedLengthsReport rep = share_modality_lengths(*train_set_, *comm_);
    lengths_s_ = seconds_since(t0);
    print("data: " + rep.summary());
  }
  if (!cfg_.eval.data.empty()) {
    DatasetConfig ec = dc;
    ec.data_path = cfg_.eval.data;
    ec.image_folder = !cfg_.eval.image_folder.empty() ? cfg_.eval.image_folder
                      : !cfg_.data.image_folder.empty() ? cfg_.data.image_folder
                                                        : fs::path(cfg_.eval.data).parent_path().string();
    eval_set_ = std::make_unique<Dataset>(ec, tokenizer_);
  }
  // The data guard (trainer/data_guard.h): unusable data stops the run here, before ARank and the first step.
  const auto print_fn = [this](const std::string& m) { print(m); };
  const DataGuardOptions guard{"data.train", cfg_.data.preflight_records, cfg_.data.max_bad_fraction, cfg_.data.workers,
                               "training order"};
  guard_dataset(*train_set_, SamplerConfig{cfg_.seed, global_batch_, cfg_.data.group_by_modality_length, 0}, guard,
                *comm_, print_fn);
  if (eval_set_) {
    DataGuardOptions eg = guard;
    eg.key = "eval.data";
    eg.order_name = "evaluation order";
    guard_dataset(*eval_set_, SamplerConfig{cfg_.seed, 1, false, 0}, eg, *comm_, print_fn);
  }
}

StepMetrics Trainer::train_step() {
  const auto t0 = Clock::now();
  const double wait0 = loader_->wait_seconds();
  StepMetrics m;
  m.step = step_ + 1;
  watchdog_set_step(m.step);  // named by the watchdog when a collective of this step times out
  m.total_steps = total_steps_;
  m.lr = sched_->current();

  // All micro-batches of the step first: the global supervised-token count normalises every micro-batch's loss.
  std::vector<Batch> micro;
  micro.reserve(size_t(accum_));
  int64_t local_sup = 0;
  TraceRange data_wait("gmod::data_wait");
  for (int k = 0; k < accum_; ++k) {
    micro.push_back(loader_->next());
    local_sup += supervised_count(micro.back().labels);
  }
  data_wait.end();
  const double n_sup = comm_->all_reduce(double(local_sup), ReduceOp::Sum);
  if (cfg_.metrics.log_sample_ids) {
    const fs::path dir = fs::path(cfg_.run_dir) / "samples";
    fs::create_directories(dir);
    std::ofstream f(dir / ("rank-" + std::to_string(rank_) + ".txt"), std::ios::app);
    for (size_t k = 0; k < micro.size(); ++k) {
      f << m.step << ' ' << k;
      for (size_t i : micro[k].indices) f << ' ' << i;
      f << '\n';
    }
  }

  const auto opts = at::TensorOptions().dtype(at::kDouble).device(device_);
  const size_t n_mod = mod_layers_.size();
  StepStats stats(n_mod, opts);  // this rank's micro-batches (flops: from what each layer processed)
  const auto lora_stream = lora_dropout_stream(*model_);  // nullptr without LoRA
  for (const Batch& b : micro) {
    const bool last = &b == &micro.back();
    if (lora_stream) lora_stream->pass = step_ * accum_ + (&b - micro.data());  // LoRA dropout: one stream per pass
    if (b.empty()) {  // every record of this slice was bad: contribute nothing, still join the step
      dp_->idle_micro_batch(last);  // (and its collectives)
      continue;
    }
    stats.tokens += b.tokens;
    stats.padded_tokens += b.input_ids.numel();
    stats.samples += b.size();
    ModelInputs in = to_model_inputs(b, device_);
    if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(dtype_);
    if (in.pixel_values_videos.defined()) in.pixel_values_videos = in.pixel_values_videos.to(dtype_);
    ForwardState st;
    TraceRange forward("gmod::forward");
    dp_->begin_forward();
    ModelOutput out = forward_label_loss(*model_, in, st);  // no [B, L, V] logits (model/lm_loss.h)
    dp_->end_forward();
    at::Tensor loss = out.lm_loss_sum * (double(world_) / std::max(1.0, n_sup));
    if (!st.aux_losses.empty()) {
      loss = loss + total_routing_loss(st, cfg_.mod.config) / double(accum_);
      at::Tensor r = at::zeros({}, opts);
      for (const auto& a : st.aux_losses) r = r + a.detach().to(at::kDouble);
      stats.routing_loss_sum += r;
    }
    // Last micro-batch of the window: its backward may start the gradient reductions (overlap_comm).
    if (last) dp_->set_last_micro_batch();
    loss = inject_faults_into_loss(loss, m.step, rank_);  // GMOD_FAULT_INJECT only (a test facility)
    forward.end();
    TraceRange backward("gmod::backward");
    loss.backward();
    dp_->end_backward();
    backward.end();
    stats.lm_loss_sum += out.lm_loss_sum.detach().to(at::kDouble);
    const int64_t images = b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
    // Packed rows: one sample per segment, and the MoD layers ran rows x (their longest kept row), so their kept
    // tokens are counted instead of a capacity plan.
    ForwardShape shape =
        ForwardShape::full(b.segments ? b.segments->flat_lengths() : sample_lengths(b.attention_mask), images);
    shape.mod_kmax = b.segments ? -1 : capacity_kmax(*model_, in.host_role_counts);  // MoD layers ran B x k_max rows
    stats.flops += train_flops(account_forward(st.tokens, model_->config, shape), flop_parts_);
    for (const LayerTokens& lt : st.tokens)
      for (size_t i = 0; i < n_mod; ++i)
        if (lt.layer == mod_layers_[i])
          stats.processed[i] += lt.processed, stats.entered[i] += lt.total,
              stats.routable[i] += std::max<int64_t>(lt.routable, 0);
  }

  // One all-reduce for every reported quantity and the stop flag (trainer/step_stats.h), after this window's
  // bucket reductions have completed: with overlap_comm they run on a second communicator, and NCCL does not
  // guarantee progress when two communicators' collectives run at once (docs/parallel.md).
  stats.stop = stop_signal_flag().load();
  const StepTotals sum = reduce_step_stats(stats, device_, [this](at::Tensor& packed) {
    TraceRange reduce("gmod::reduce");  // waits for the gradient reductions, then the step's reported numbers
    dp_->all_reduce_after_gradients(packed, ReduceOp::Sum);
  });

  const std::vector<double> lrs = group_lrs();
  if (param_groups_.grouped())
    for (size_t g = 0; g < lrs.size(); ++g)
      if (!param_groups_.groups[g].freeze) m.lr_groups.emplace_back(param_groups_.groups[g].name, lrs[g]);
  TraceRange optimizer("gmod::optimizer");
  const StepResult res = dp_->step(lrs);
  optimizer.end();
  // A skipped (non-finite) step does not advance the LR schedule, as Megatron and DeepSpeed hold it: the next
  // applied update gets the learning rate the skipped one would have had.
  if (!res.skipped) sched_->advance();
  ++step_;

  m.lm_loss = sum.lm_loss_sum / std::max(1.0, n_sup);
  m.routing_loss = sum.routing_loss_sum / (double(world_) * accum_);
  m.loss = m.lm_loss + cfg_.mod.config.router_aux_loss_coef * m.routing_loss * (n_mod > 0 ? 1.0 : 0.0);
  m.supervised_tokens = int64_t(n_sup);
  m.tokens = int64_t(sum.tokens);
  m.samples = int64_t(sum.samples);
  m.padded_tokens = int64_t(sum.padded_tokens);
  stop_requested_ = stop_requested_ || sum.stop;
  sum.skip_ratios(mod_layers_, m.skip_ratio, m.skip_ratio_routable);
  m.grad_norm = res.grad_norm;
  m.skipped = res.skipped;
  if (res.skipped) {
    ++skipped_total_;
    ++consecutive_skipped_;
  } else {
    consecutive_skipped_ = 0;
  }
  m.skipped_total = skipped_total_;
  const DataPosition pos = loader_->position();
  m.epoch = pos.epoch;
  m.consumed_samples = pos.consumed_samples;
  m.step_seconds = seconds_since(t0);
  m.data_wait_seconds = loader_->wait_seconds() - wait0;
  m.flops = sum.flops.flops;
  m.dense_flops = sum.flops.dense_flops;
  return m;
}

TrainResult Trainer::run() {
  // SIGUSR1 is what schedulers send ahead of preemption (Slurm --signal) and what mpirun forwards without killing;
  // SIGTERM/SIGINT mean the same here. Either way: finish the step, agree across ranks, save, exit 0.
  struct sigaction sa {}, old_term {}, old_int {}, old_usr1 {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGUSR1, &sa, &old_usr1);
  struct Restore {
    struct sigaction t, i, u;
    ~Restore() {
      sigaction(SIGTERM, &t, nullptr);
      sigaction(SIGINT, &i, nullptr);
      sigaction(SIGUSR1, &u, nullptr);
    }
  } restore{old_term, old_int, old_usr1};

  TrainResult result;
  // A stop signal that reached any rank during set-up ends the job here, cleanly, before the first step.
  const int64_t first_step = step_;
  if (comm_->all_reduce(stop_signal_flag().load() ? 1.0 : 0.0, ReduceOp::Max) > 0) {
    stop_requested_ = true;
    print("stop signal received during set-up: stopping before step " + std::to_string(step_ + 1) +
          "; nothing trained, no checkpoint written" +
          (last_checkpoint_.empty() ? "" : " (the last one is " + last_checkpoint_ + ")"));
  }
  const int64_t exit_at = cfg_.schedule.exit_at_step > 0 ? cfg_.schedule.exit_at_step : total_steps_;
  while (step_ < std::min(total_steps_, exit_at) && !stop_requested_) {
    if (profiler_) profiler_->before_step(step_ + 1);
    StepMetrics m = train_step();
    if (step_ == first_step + 1) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "startup: model load %.2f s, data index %.2f s, lengths %.2f s, first step at %.2f s (since the "
                    "process started)",
                    model_load_s_, data_index_s_, lengths_s_, seconds_since(process_start));
      print(line);
    }
    if (m.skipped)
      print("warning: step " + std::to_string(m.step) + " skipped: non-finite gradient (" +
            std::to_string(consecutive_skipped_) + " in a row, " + std::to_string(skipped_total_) + " in total)");
    if (consecutive_skipped_ >= cfg_.max_consecutive_skipped)
      throw std::runtime_error("step " + std::to_string(m.step) + ": " + std::to_string(consecutive_skipped_) +
                               " consecutive steps had non-finite gradients (max_consecutive_skipped = " +
                               std::to_string(cfg_.max_consecutive_skipped) + "); aborting");
    if (step_ % cfg_.metrics.log_every == 0 || step_ == total_steps_ || m.skipped)
      logger_->log(m, rank_ == 0 ? memory_stats(device_) : json::object());
    if (eval_set_ && cfg_.eval.every > 0 && step_ % cfg_.eval.every == 0) logger_->log_eval(step_, evaluate());
    if (pending_save_) poll_async_save(/*wait=*/false);
    if (cfg_.checkpoint.every > 0 && step_ % cfg_.checkpoint.every == 0 && !stop_requested_) save_checkpoint();
    if (profiler_) profiler_->after_step(step_);
  }
  if (eval_set_ && step_ == total_steps_ && (cfg_.eval.every == 0 || step_ % cfg_.eval.every != 0))
    logger_->log_eval(step_, evaluate());
  // A save in flight is finished first (a stop signal included); the last step's own save is synchronous.
  if (pending_save_) poll_async_save(/*wait=*/true);
  if (last_saved_step_ != step_ && !(stop_requested_ && step_ == first_step)) save_checkpoint(/*allow_async=*/false);
  logger_->finish();
  result.final_step = step_;
  result.stopped_by_signal = stop_requested_;
  result.last_checkpoint = last_checkpoint_;
  print(std::string(stop_requested_ ? "stopped by signal" : "done") + " at step " + std::to_string(step_) +
        "; checkpoint " + last_checkpoint_);
  return result;
}

}  // namespace gmod

// `gmod eval`: held-out evaluation of a dense or γ-MoD model on a dataset, in record order: LM loss,
// exact-match accuracy of the greedy first answer (as the Trainer's evaluation), skip ratio per MoD layer
// and overall, and the realised FLOP ratio: executed FLOPs against the dense model on the same tokens
// (mod/accounting.h).
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/batch.h"
#include "launch/cli_model.h"
#include "mod/accounting.h"
#include "mod/answer_match.h"
#include "model/lm_loss.h"

namespace gmod::cli {
namespace {

struct EvalOptions {
  ModelOptions model;
  TextOptions text;
  DataOptions data;
  int batch = 4;
  int64_t max_batches = 0;
  std::string json;
  bool no_exact_match = false;
};

int run_eval(const EvalOptions& o) {
  const int batch = o.batch;
  const int64_t max_batches = o.max_batches;
  const bool exact = !o.no_exact_match;
  CliModel m = load_cli_model(o.model);
  auto tok = load_cli_tokenizer(o.text, m);
  auto ds = make_cli_dataset(o.data, o.text, m, tok);

  double loss_sum = 0;
  int64_t supervised = 0, samples = 0, bad = 0, batches = 0, hits = 0, counted = 0;
  ComputeReport report;
  torch::NoGradGuard no_grad;
  std::map<int, std::pair<int64_t, int64_t>> routable_skips;  // MoD layer -> (skipped, routable) tokens
  std::vector<PreparedSample> pending;
  auto run_batch = [&] {
    if (pending.empty()) return;
    Batch b = collate(pending, ds->encoder().pad_id(), crop_size(*ds));
    pending.clear();
    ModelInputs in = to_model_inputs(b, m.device);
    if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(m.dtype);
    if (in.pixel_values_videos.defined()) in.pixel_values_videos = in.pixel_values_videos.to(m.dtype);
    ForwardState st;
    ModelOutput out = forward_label_loss(*m.model, in, st);  // loss only: no [B, L, V] logits
    loss_sum += out.lm_loss_sum.item<double>();
    supervised += out.supervised_tokens;
    samples += b.size();
    const int64_t images = b.image_grid_thw.defined() ? b.image_grid_thw.size(0)
                           : b.pixel_values.defined() ? b.pixel_values.size(0) : 0;
    report.add(account_forward(st.tokens, m.model->config, ForwardShape::full(sample_lengths(b.attention_mask), images)));
    for (const LayerTokens& t : st.tokens)
      if (t.routable >= 0) routable_skips[t.layer].first += t.total - t.processed, routable_skips[t.layer].second += t.routable;
    if (exact) {
      const auto [h, c] = first_answer_exact_match(*m.model, in);
      hits += h, counted += c;
    }
    ++batches;
  };
  for (size_t i = 0; i < ds->size() && (max_batches <= 0 || batches < max_batches); ++i) {
    PreparedSample s;
    BadRecord br;
    if (!ds->try_prepare(i, s, br)) {
      ++bad;
      std::cerr << "skipped: " << br.message << "\n";
      continue;
    }
    pending.push_back(std::move(s));
    if (int(pending.size()) == batch) run_batch();
  }
  if (max_batches <= 0 || batches < max_batches) run_batch();
  if (samples == 0) throw std::runtime_error(ds->config().data_path + ": no usable record");

  const double loss = loss_sum / std::max<int64_t>(1, supervised);
  std::cout << "eval " << m.dir << " on " << ds->config().data_path << ": " << samples << " samples in " << batches
            << " batches, " << supervised << " supervised tokens" << (bad ? ", " + std::to_string(bad) + " bad records skipped" : "")
            << "\n";
  std::printf("loss            %.6f\n", loss);
  if (exact) std::printf("exact match     %.4f (%lld/%lld first answers, greedy)\n", double(hits) / std::max<int64_t>(1, counted),
                         static_cast<long long>(hits), static_cast<long long>(counted));
  std::printf("skip ratio      %.4f (MoD layers %.4f)\n", report.skip_ratio(), report.mod_skip_ratio());
  // Realised: the forwards as executed (MoD layers: the tokens they kept and their attention pairs) against the
  // dense model on the same tokens, decoder + LM head + vision tower + projector (mod/accounting.h).
  std::printf("FLOPs vs dense  %.4f realised (%.4g / %.4g GFLOP; decoder layers alone %.4f)\n", report.flop_ratio(),
              report.flops * 1e-9, report.dense_flops * 1e-9, report.decoder_flop_ratio());
  // Per MoD layer both ratios: skipped share of all tokens (the paper's α) and of the routable tokens (skip_frac's).
  int64_t all_skipped = 0, all_routable = 0;
  for (const auto& [layer, sr] : routable_skips) all_skipped += sr.first, all_routable += sr.second;
  if (!routable_skips.empty())
    std::printf("skip of routable %.4f (MoD layers: %lld skipped of %lld routable)\n",
                all_routable ? double(all_skipped) / double(all_routable) : 0.0, static_cast<long long>(all_skipped),
                static_cast<long long>(all_routable));
  for (const auto& l : report.layers)
    if (l.mod) {
      const auto& sr = routable_skips[l.layer];
      std::printf("  layer %d skipped %.4f of all tokens, %.4f of routable tokens\n", l.layer, l.skip_ratio(),
                  sr.second ? double(sr.first) / double(sr.second) : 0.0);
    }
  std::cout << report.table();

  if (!o.json.empty()) {
    const std::string* path = &o.json;
    nlohmann::json j{{"model", m.dir},        {"data", ds->config().data_path}, {"samples", samples},
                     {"batches", batches},    {"supervised_tokens", supervised}, {"loss", loss},
                     {"compute", report.to_json()}};
    if (exact) j["exact_match"] = double(hits) / std::max<int64_t>(1, counted), j["exact_match_samples"] = counted;
    nlohmann::json sr = nlohmann::json::object();
    for (const auto& l : report.layers)
      if (l.mod) sr[std::to_string(l.layer)] = l.skip_ratio();
    j["skip_ratio"] = sr;  // of all tokens (α)
    nlohmann::json srr = nlohmann::json::object();
    for (const auto& [layer, r] : routable_skips)
      if (r.second > 0) srr[std::to_string(layer)] = double(r.first) / double(r.second);
    j["skip_ratio_routable"] = srr;
    std::ofstream f(*path);
    if (!f) throw std::runtime_error("--json: cannot write " + *path);
    f << j.dump(2) << "\n";
    std::cout << "wrote " << *path << "\n";
  }
  return 0;
}

Runner setup_eval(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  add_model_options(app, o->model);
  add_text_options(app, o->text);
  add_data_options(app, o->data);
  add(app, "--batch", o->batch, "samples per forward")->check(positive());
  add(app, "--max-batches", o->max_batches, "stop after this many batches (0: the whole dataset)")
      ->check(non_negative());
  add(app, "--json", o->json, "also write the figures as JSON here")->type_name("FILE");
  add_flag(app, "--no-exact-match", o->no_exact_match, "skip the greedy first-answer exact match (faster)");
  return [o] { return run_eval(*o); };
}

Register reg_eval({"eval", "loss, exact-match accuracy, skip ratio and FLOPs of a model on a dataset",
                   setup_eval});

}  // namespace
}  // namespace gmod::cli

// `gmod arank`: per-layer ARank (γ-MoD §3) of a dense model on the first image records of a dataset, each cut to its
// first prompt (data/arank_samples.h),
// as the official compute_attention_rank script does (text-only records are skipped). Prints the table
// and writes {mean, std, samples} per layer as JSON, with the samples' mean token count ("seqlen": the
// avg_seqlen `gmod convert --adaptive-threshold seqlen` takes from this file).
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "data/arank_samples.h"
#include "launch/cli_model.h"
#include "mod/arank.h"

namespace gmod::cli {
namespace {

const char* kArankFooter =
    "Default (γ-MoD's protocol): the first image records, each cut to its first prompt (system + question up "
    "to the\n"
    "assistant turn, no answer), prefill only. --full-conversations: whole conversations (the earlier "
    "default).";

struct ARankCliOptions {
  ModelOptions model;
  TextOptions text;
  DataOptions data;
  int64_t samples = 50;
  int batch = 4;
  std::string out;
  bool full_conversations = false;
};

int run_arank(const ARankCliOptions& o) {
  const int64_t samples = o.samples;
  const int batch = o.batch;
  CliModel m = load_cli_model(o.model);
  auto tok = load_cli_tokenizer(o.text, m);
  auto ds = make_cli_dataset(o.data, o.text, m, tok);

  ARankSampling sampling;
  sampling.samples = samples;
  sampling.batch = batch;
  sampling.prompt_only = !o.full_conversations;
  ARankSamplingStats stats;
  std::vector<size_t> order(ds->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<ModelInputs> batches;
  const std::vector<Batch> sampled = arank_batches(*ds, order, sampling, stats);
  const SeqLenMean seqlen = mean_seqlen(sampled);
  for (const Batch& b : sampled) {
    ModelInputs in = to_model_inputs(b, m.device);
    if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(m.dtype);
    batches.push_back(in);
  }
  std::cout << "arank: " << stats.summary() << " with images from " << ds->config().data_path << ", "
            << (sampling.prompt_only ? "first prompt up to the assistant turn (prefill)" : "whole conversations")
            << "\n";
  ARankOptions ao;
  ao.max_samples = samples;
  torch::NoGradGuard no_grad;
  const ARankResult r = compute_arank(*m.model, batches, ao);
  std::cout << r.table();
  std::cout << "mean tokens per sample: " << seqlen.mean << " (" << seqlen.samples << " samples)\n";
  if (!o.out.empty()) {
    nlohmann::json j = r.to_json();
    j["seqlen"] = {{"mean", seqlen.mean},
                   {"samples", seqlen.samples},
                   {"of", sampling.prompt_only ? "first prompts" : "whole conversations"},
                   {"data", ds->config().data_path}};
    std::ofstream f(o.out);
    if (!(f << j.dump(2) << "\n")) throw std::runtime_error("--out " + o.out + ": cannot write");
    std::cout << "wrote " << o.out << "\n";
  }
  return 0;
}

Runner setup_arank(CLI::App& app) {
  auto o = std::make_shared<ARankCliOptions>();
  app.footer(kArankFooter);
  add_model_options(app, o->model);
  add_text_options(app, o->text);
  add_data_options(app, o->data);
  add(app, "--samples", o->samples, "image records to sample")->check(positive());
  add(app, "--batch", o->batch, "samples per forward")->check(positive());
  add(app, "--out", o->out, "write {mean, std, samples} per layer as JSON here (for gmod convert --arank)")
      ->type_name("JSON");
  add_flag(app, "--full-conversations", o->full_conversations, "whole conversations instead of the first prompt");
  return [o] { return run_arank(*o); };
}

Register reg_arank({"arank", "per-layer attention rank (ARank) of a dense model on dataset samples",
                    setup_arank});

}  // namespace
}  // namespace gmod::cli

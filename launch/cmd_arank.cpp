// `gmod arank`: per-layer ARank (γ-MoD §3) of a dense model on the first image records of a dataset, each cut to its
// first prompt (data/arank_samples.h),
// as the official compute_attention_rank script does (text-only records are skipped). Prints the table
// and writes {mean, std, samples} per layer as JSON.
#include <torch/torch.h>

#include <iostream>

#include "data/arank_samples.h"
#include "launch/cli_model.h"
#include "mod/arank.h"

namespace gmod::cli {
namespace {

const char* kUsage =
    "usage: gmod arank --model DIR --data JSON [--images DIR] [--tokenizer T] [--samples 50] [--batch 4]\n"
    "                  [--template vicuna_v1] [--max-len N] [--out arank.json] [--dtype fp32|bf16] [--device D]\n"
    "                  [--full-conversations]\n"
    "Default (γ-MoD's protocol): the first image records, each cut to its first prompt (system + question up to the\n"
    "assistant turn, no answer), prefill only. --full-conversations: whole conversations (the earlier default).\n";

int run_arank(const std::vector<std::string>& argv) {
  Args a(argv, {"full-conversations"});
  if (argv.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  a.check_known(known_options({kModelOptions, kDataOptions, {"samples", "batch", "out", "full-conversations"}}));
  const int64_t samples = std::stoll(a.get_or("samples", "50"));
  const int batch = std::stoi(a.get_or("batch", "4"));
  if (samples <= 0 || batch <= 0) throw std::invalid_argument("--samples and --batch must be positive");
  CliModel m = load_cli_model(a);
  auto tok = load_cli_tokenizer(a, m);
  auto ds = make_cli_dataset(a, m, tok);

  ARankSampling sampling;
  sampling.samples = samples;
  sampling.batch = batch;
  sampling.prompt_only = !a.flag("full-conversations");
  ARankSamplingStats stats;
  std::vector<size_t> order(ds->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<ModelInputs> batches;
  for (const Batch& b : arank_batches(*ds, order, sampling, stats)) {
    ModelInputs in = to_model_inputs(b, m.device);
    if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(m.dtype);
    batches.push_back(in);
  }
  std::cout << "arank: " << stats.summary() << " with images from " << ds->config().data_path << ", "
            << (sampling.prompt_only ? "first prompt up to the assistant turn (prefill)" : "whole conversations")
            << "\n";
  ARankOptions o;
  o.max_samples = samples;
  torch::NoGradGuard no_grad;
  const ARankResult r = compute_arank(*m.model, batches, o);
  std::cout << r.table();
  if (auto out = a.get("out")) {
    write_arank_json(r, *out);
    std::cout << "wrote " << *out << "\n";
  }
  return 0;
}

Register reg({"arank", "per-layer attention rank (ARank) of a dense model on dataset samples", run_arank});

}  // namespace
}  // namespace gmod::cli

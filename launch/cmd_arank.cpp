// `gmod arank`: per-layer ARank (γ-MoD §3) of a dense model on the first image records of a dataset,
// as the official compute_attention_rank script does (text-only records are skipped). Prints the table
// and writes {mean, std, samples} per layer as JSON.
#include <torch/torch.h>

#include <iostream>

#include "data/batch.h"
#include "launch/cli_model.h"
#include "mod/arank.h"

namespace gmod::cli {
namespace {

const char* kUsage =
    "usage: gmod arank --model DIR --data JSON [--images DIR] [--tokenizer T] [--samples 50] [--batch 4]\n"
    "                  [--template vicuna_v1] [--max-len N] [--out arank.json] [--dtype fp32|bf16] [--device D]\n";

int run_arank(const std::vector<std::string>& argv) {
  Args a(argv);
  if (argv.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  a.check_known(known_options({kModelOptions, kDataOptions, {"samples", "batch", "out"}}));
  const int64_t samples = std::stoll(a.get_or("samples", "50"));
  const int batch = std::stoi(a.get_or("batch", "4"));
  if (samples <= 0 || batch <= 0) throw std::invalid_argument("--samples and --batch must be positive");
  CliModel m = load_cli_model(a);
  auto tok = load_cli_tokenizer(a, m);
  auto ds = make_cli_dataset(a, m, tok);

  std::vector<ModelInputs> batches;
  std::vector<PreparedSample> pending;
  int64_t taken = 0, text_only = 0, bad = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    Batch b = collate(pending, ds->encoder().pad_id(), crop_size(*ds));
    ModelInputs in = to_model_inputs(b, m.device);
    if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(m.dtype);
    batches.push_back(in);
    pending.clear();
  };
  for (size_t i = 0; i < ds->size() && taken < samples; ++i) {
    PreparedSample s;
    BadRecord br;
    if (!ds->try_prepare(i, s, br)) {
      ++bad;
      std::cerr << "skipped: " << br.message << "\n";
      continue;
    }
    if (s.sample.images.empty()) {
      ++text_only;
      continue;
    }
    pending.push_back(std::move(s));
    ++taken;
    if (int(pending.size()) == batch) flush();
  }
  flush();
  if (taken == 0) throw std::runtime_error(ds->config().data_path + ": no usable record with an image");
  std::cout << "arank: " << taken << " samples with images from " << ds->config().data_path << " (" << text_only
            << " text-only and " << bad << " bad records skipped)\n";
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

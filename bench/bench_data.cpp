// Data pipeline throughput (JSON -> tokens, decoded + CLIP-preprocessed 336 px images -> collated batch) per
// worker thread, next to how fast a small demo MultimodalLM consumes batches (forward + backward), on the
// demo dataset.
//   bench_data [--records N] [--batches N] [--micro-batch N] [--workers 1,2] [--tokenizer PATH] [--device
//   cpu|cuda]
#include <ftw.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "bench/bench_help.h"
#include "data/demo_dataset.h"
#include "data/loader.h"

using namespace gmod;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The repository's SentencePiece fixture. GMOD_SOURCE_ROOT is the absolute source dir CMake built this from
// (__FILE__ is relative to the build dir under Ninja, which broke runs from any other directory).
std::string default_tokenizer() {
  const char* env = std::getenv("GMOD_SOURCE_DIR");
  const std::filesystem::path root = env ? env : GMOD_SOURCE_ROOT;
  return (root / "tests/fixtures/tokenizer/sp/tokenizer.model").string();
}

}  // namespace

const char* const kUsage =
    "usage: bench_data [--records N] [--batches N] [--micro-batch N] [--workers 1,2] [--tokenizer PATH]\n"
    "                  [--device cpu|cuda]\n"
    "Data pipeline throughput (JSON -> tokens, 336 px images decoded and CLIP-preprocessed -> batches)\n"
    "per worker count on a generated demo dataset, next to how fast a small model consumes batches. The\n"
    "default tokenizer is the repository's test fixture (found from the source dir this was built from,\n"
    "or $GMOD_SOURCE_DIR).\n";

namespace {

int run(int argc, char** argv) {
  int records = 256, batches = 16, mb = 8;
  std::vector<int> worker_counts = {1, 2};
  std::string tokenizer = default_tokenizer(), device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--records")
      records = std::stoi(v);
    else if (a == "--batches")
      batches = std::stoi(v);
    else if (a == "--micro-batch")
      mb = std::stoi(v);
    else if (a == "--tokenizer")
      tokenizer = v;
    else if (a == "--device")
      device_name = v;
    else if (a == "--workers") {
      worker_counts.clear();
      std::stringstream ss(v);
      for (std::string w; std::getline(ss, w, ',');) worker_counts.push_back(std::stoi(w));
    } else {
      std::cerr << "bench_data: unknown option " << a << " (--help lists them)\n";
      return 2;
    }
  }
  if (!std::filesystem::is_regular_file(tokenizer))
    throw std::runtime_error("tokenizer " + tokenizer +
                             " is not a file: pass --tokenizer PATH (or set GMOD_SOURCE_DIR "
                             "to the repository root)");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gmod-bench-data-" + std::to_string(getpid()));
  DemoDatasetOptions demo;
  demo.num_train = records;
  demo.num_heldout = 1;
  demo.image_size = 336;
  auto t0 = Clock::now();
  make_demo_dataset(dir.string(), demo);
  std::printf("demo dataset: %d records, 336 px images, generated in %.2f s\n", records, seconds_since(t0));

  LlavaConfig mc;
  mc.text.vocab_size = 832;
  mc.text.hidden_size = 256;
  mc.text.intermediate_size = 688;
  mc.text.num_hidden_layers = 4;
  mc.text.num_attention_heads = 4;
  mc.text.num_key_value_heads = 4;
  mc.vision = ClipVisionConfig{};
  mc.vision->hidden_size = 256;
  mc.vision->intermediate_size = 1024;
  mc.vision->num_hidden_layers = 4;
  mc.vision->num_attention_heads = 4;
  mc.image_token_id = 800;

  DatasetConfig dc;
  dc.data_path = (dir / "train.json").string();
  dc.image_folder = dir.string();
  dc.conversation.image_seq_length = mc.image_seq_length();
  dc.conversation.image_token_id = mc.image_token_id;
  dc.sample.max_len = 2048;
  Dataset ds(dc, load_tokenizer(tokenizer));

  LoaderConfig lc;
  lc.micro_batch_size = mb;
  lc.sampler.global_batch_size = mb;
  lc.sampler.seed = 1;
  lc.log_bad_records = false;
  std::printf("pipeline: micro-batch %d, %d batches per run, %u hardware threads\n", mb, batches,
              std::thread::hardware_concurrency());
  for (int w : worker_counts) {
    lc.num_workers = w;
    lc.prefetch = std::max(2, 2 * w);
    DataLoader dl(ds, lc);
    dl.next();  // warm-up (thread start, first epoch order)
    t0 = Clock::now();
    int64_t samples = 0, tokens = 0;
    for (int b = 0; b < batches; ++b) {
      Batch batch = dl.next();
      samples += batch.size();
      tokens += batch.tokens;
    }
    const double s = seconds_since(t0);
    std::printf(
        "  workers=%d: %8.1f samples/s (%6.1f samples/s per worker), %9.0f tokens/s, next() waited %.2f s\n",
        w, samples / s, samples / s / std::max(1, w), tokens / s, dl.wait_seconds());
  }

  const at::Device device(device_name);
  MultimodalLM model(mc);
  model.init_weights(0);
  model.to(device);
  lc.num_workers = 2;
  DataLoader dl(ds, lc);
  std::vector<Batch> prepared;
  for (int b = 0; b < std::min(batches, 6); ++b) prepared.push_back(dl.next());
  auto step = [&](const Batch& b) {
    ModelInputs in = to_model_inputs(b, device);
    auto out = model.forward(in);
    out.lm_loss.backward();
    model.zero_grad();
  };
  step(prepared[0]);  // warm-up
  if (device.is_cuda()) torch::cuda::synchronize();
  t0 = Clock::now();
  int64_t samples = 0;
  for (size_t i = 1; i < prepared.size(); ++i) {
    step(prepared[i]);
    samples += prepared[i].size();
  }
  if (device.is_cuda()) torch::cuda::synchronize();
  const double s = seconds_since(t0);
  std::printf(
      "trainer consumption (%s, demo model: LLM 4x256, CLIP 4x256 at 336 px = %d image tokens, fp32 "
      "fwd+bwd): "
      "%.1f samples/s\n",
      device_name.c_str(), mc.image_seq_length(), samples / s);
  // nftw, not std::filesystem::remove_all (crashes next to libtorch.so, see docs/engineering.md)
  nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: error: %s\n", e.what());
    return 1;
  }
}

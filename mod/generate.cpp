#include "mod/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <stdexcept>

#include "mod/decode_batch.h"

namespace gmod {

namespace {
// Waits for the work queued on `d` (nothing to wait for on the CPU): the timing boundaries of generate().
void sync_device(at::Device d) {
  if (!d.is_cpu()) c10::impl::VirtualGuardImpl(d.type()).synchronizeDevice(d.index());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

at::Tensor choose_next_tokens(const at::Tensor& logits, const GenerateOptions& opt, at::Generator& gen) {
  if (opt.greedy) return logits.argmax(-1);
  if (!(opt.temperature > 0.0)) throw std::invalid_argument("generate: temperature must be > 0 when sampling");
  if (!(opt.top_p > 0.0 && opt.top_p <= 1.0))
    throw std::invalid_argument("generate: top_p must be in (0, 1] when sampling, got " + std::to_string(opt.top_p));
  auto probs = at::softmax(logits.to(at::kFloat) / opt.temperature, -1).cpu();
  if (opt.top_p < 1.0) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    auto before = sorted.cumsum(-1) - sorted;  // mass of strictly better tokens
    sorted = sorted.masked_fill(before >= opt.top_p, 0.0);  // always keeps the best token
    probs = at::zeros_like(probs).scatter(-1, order, sorted);
  }
  return at::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(1).to(logits.device());
}

GenerateResult generate(MultimodalLM& model, const ModelInputs& prompt, const GenerateOptions& opt) {
  at::NoGradGuard no_grad;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t B = prompt.input_ids.size(0);
  const auto dev = prompt.input_ids.device();
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  const int64_t eos = opt.eos_token_id == -2 ? model.config.text.eos_token_id : opt.eos_token_id;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);

  // Every prompt is admitted at once (one prefill), then every step feeds each row's last token.
  DecodeBatchOptions bo;
  bo.use_cache = opt.use_cache;
  DecodeBatch batch(model, bo);
  at::Tensor logits = batch.admit(prompt, std::max<int64_t>(opt.max_new_tokens, 1)).logits;  // [B, V]
  GenerateResult res;
  sync_device(dev);
  res.prefill_seconds = seconds_since(t_start);
  res.prefill_kv_bytes = batch.kv_bytes();
  const auto t_decode = std::chrono::steady_clock::now();

  std::vector<at::Tensor> out;
  auto finished = at::zeros({B}, lopts.dtype(at::kBool));
  auto lengths = at::zeros({B}, lopts);
  std::vector<bool> released(size_t(B), false);
  for (int64_t t = 0; t < opt.max_new_tokens; ++t) {
    // Each step's next tokens are chosen here, and only here.
    auto next = at::where(finished, at::full_like(lengths, opt.pad_token_id), choose_next_tokens(logits, opt, gen));
    if (opt.keep_logits) res.step_logits.push_back(logits);
    out.push_back(next);
    lengths = lengths + finished.logical_not().to(at::kLong);  // a token this step, EOS included
    if (eos >= 0) finished = finished | (next == eos);
    // The one device-to-host copy of the step: which samples are finished now.
    const auto host = finished.cpu();
    const auto ha = host.accessor<bool, 1>();
    bool all_finished = true;
    for (int64_t b = 0; b < B; ++b) all_finished = all_finished && ha[b];
    if (opt.on_step && !opt.on_step(t, next)) break;
    if (t + 1 == opt.max_new_tokens || all_finished) break;
    // Samples that just ended with EOS leave the batch: their step would be computed and counted for nothing, and
    // the counts would depend on who else is in the batch. Their rows stay (fed pads, never compacted), so each
    // step's logits keep one row per sample.
    for (int64_t b = 0; b < B; ++b)
      if (ha[b] && !released[size_t(b)]) {
        batch.release(b);
        released[size_t(b)] = true;
      }
    ++res.decode_steps;
    logits = batch.step(next);
  }
  res.layer_tokens = batch.layer_tokens();
  res.compute = batch.compute();
  res.tokens = at::stack(out, 1);
  res.lengths = lengths;
  sync_device(dev);
  res.decode_seconds = seconds_since(t_decode);
  return res;
}

}  // namespace gmod

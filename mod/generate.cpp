#include "mod/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <stdexcept>

#include "model/kv_cache.h"
#include "model/token_roles.h"

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
  const int64_t B = prompt.input_ids.size(0), L = prompt.input_ids.size(1);
  const auto dev = prompt.input_ids.device();
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto mask = prompt.attention_mask.defined() ? prompt.attention_mask.to(at::kBool)
                                              : at::ones({B, L}, lopts.dtype(at::kBool));
  auto n = mask.sum(1);  // prompt lengths (right padding)
  const std::vector<int64_t> prompt_len = sample_lengths(mask);
  for (auto len : prompt_len)
    if (len < 1) throw std::invalid_argument("generate: every prompt needs at least one token");
  const int64_t n_images = prompt.pixel_values.defined() ? prompt.pixel_values.size(0) : 0;
  const int64_t eos = opt.eos_token_id == -2 ? model.config.text.eos_token_id : opt.eos_token_id;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  auto answer = at::full({B, 1}, static_cast<int64_t>(TokenRole::kAnswer), lopts.dtype(at::kChar));
  auto pad_role = at::full({B, 1}, static_cast<int64_t>(TokenRole::kPad), lopts.dtype(at::kChar));

  GenerateResult res;
  std::vector<at::Tensor> out;
  auto finished = at::zeros({B}, lopts.dtype(at::kBool));
  auto lengths = at::zeros({B}, lopts);
  const int64_t n_layers = static_cast<int64_t>(model.llm->layers->size());
  std::vector<KVCache> caches(n_layers);

  // Full-sequence state for the recomputation path.
  auto ids = prompt.input_ids;
  auto full_mask = mask;
  auto positions = prompt.positions.defined() ? prompt.positions : at::arange(L, lopts).unsqueeze(0).expand({B, L});
  auto roles = prompt.token_roles;

  at::Tensor logits;  // [B, V]
  {
    ForwardState st;
    prepare_forward_state(st, prompt.input_ids, prompt.attention_mask, positions);
    st.token_roles = prompt.token_roles;
    if (opt.use_cache) st.caches = &caches;
    auto h = model.llm->forward(model.embed_inputs(prompt.input_ids, prompt.pixel_values), st);
    auto last = h.gather(1, (n - 1).view({B, 1, 1}).expand({B, 1, h.size(2)})).squeeze(1);
    logits = model.logits(last);
    res.layer_tokens = st.tokens;
    ForwardShape shape = ForwardShape::full(prompt_len, n_images);
    shape.head_tokens = B;  // the last prompt position of each sample
    res.compute = account_forward(st.tokens, model.config, shape);
  }
  // Room for every token still to come: decode steps write their K/V in place (model/kv_cache.h).
  if (opt.use_cache)
    for (auto& c : caches) kv_reserve(c, c.length() + opt.max_new_tokens);
  sync_device(dev);
  res.prefill_seconds = seconds_since(t_start);
  const auto t_decode = std::chrono::steady_clock::now();

  // Key validity of the cached path: the prompt's, then one column per fed token, written in place.
  auto key_buf = at::zeros({B, L + std::max<int64_t>(opt.max_new_tokens, 0)}, lopts.dtype(at::kBool));
  key_buf.narrow(1, 0, L).copy_(mask);
  for (int64_t t = 0; t < opt.max_new_tokens; ++t) {
    // Each step's next tokens are chosen here, and only here.
    auto next = at::where(finished, at::full_like(lengths, opt.pad_token_id), choose_next_tokens(logits, opt, gen));
    if (opt.keep_logits) res.step_logits.push_back(logits);
    out.push_back(next);
    lengths = lengths + finished.logical_not().to(at::kLong);  // a token this step, EOS included
    if (eos >= 0) finished = finished | (next == eos);
    // The samples whose token is fed to the next step: not those that just ended with EOS (their step would be
    // computed and counted for nothing, and the counts would depend on who else is in the batch).
    auto new_valid = finished.logical_not();
    // The one device-to-host copy of the step: which samples go on, which are finished now.
    const auto host = at::stack({new_valid, finished}).cpu();
    const auto ha = host.accessor<bool, 2>();
    std::vector<int64_t> step_new(B);  // 1 per unfinished sample
    int64_t n_new = 0;
    bool all_finished = true;
    for (int64_t b = 0; b < B; ++b) {
      step_new[b] = ha[0][b] ? 1 : 0;
      n_new += step_new[b];
      all_finished = all_finished && ha[1][b];
    }
    if (opt.on_step && !opt.on_step(t, next)) break;
    if (t + 1 == opt.max_new_tokens || all_finished) break;

    auto step_roles = at::where(new_valid.unsqueeze(1), answer, pad_role);
    ForwardShape shape;
    auto step_pos = (n + t).unsqueeze(1);
    ForwardState st;
    at::Tensor h;
    ++res.decode_steps;
    if (opt.use_cache) {
      key_buf.select(1, L + t).copy_(new_valid);
      const int64_t T = L + t + 1;
      auto key_hist = key_buf.narrow(1, 0, T);
      st.positions = step_pos;
      st.key_valid = key_hist;
      st.mask = AttentionMask::causal(key_hist, 1, T, T - 1);
      st.token_roles = step_roles;
      st.valid_tokens = n_new;
      st.caches = &caches;
      h = model.llm->forward(model.llm->embed(next.unsqueeze(1)), st).select(1, 0);
      // Dense reference: the new token attends to the prompt and the t tokens generated before it.
      shape.fresh = step_new;
      for (size_t b = 0; b < step_new.size(); ++b) shape.context.push_back(step_new[b] ? prompt_len[b] + t : 0);
    } else {
      ids = at::cat({ids, next.unsqueeze(1)}, 1);
      full_mask = at::cat({full_mask, new_valid.unsqueeze(1)}, 1);
      positions = at::cat({positions, step_pos}, 1);
      if (roles.defined()) roles = at::cat({roles, step_roles}, 1);
      prepare_forward_state(st, ids, full_mask, positions);
      st.token_roles = roles;
      h = model.llm->forward(model.embed_inputs(ids, prompt.pixel_values), st).select(1, ids.size(1) - 1);
      shape = ForwardShape::full(sample_lengths(full_mask), n_images);  // everything recomputed
    }
    logits = model.logits(h);
    shape.head_tokens = n_new;
    res.layer_tokens.insert(res.layer_tokens.end(), st.tokens.begin(), st.tokens.end());
    res.compute.add(account_forward(st.tokens, model.config, shape));
  }
  res.tokens = at::stack(out, 1);
  res.lengths = lengths;
  sync_device(dev);
  res.decode_seconds = seconds_since(t_decode);
  return res;
}

}  // namespace gmod

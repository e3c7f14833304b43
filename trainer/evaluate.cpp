// Held-out evaluation of the Trainer: LM loss, exact-match accuracy of greedy answers and MoD skip ratio, summed
// over this rank's slice of the eval set and all-reduced.
#include <torch/torch.h>

#include "mod/generate.h"
#include "trainer/trainer.h"

namespace gmod {

using json = nlohmann::json;

namespace {

// Greedy generation of each row's first answer from the prompt before it; true when the generated tokens equal the
// reference answer (end-of-turn token included). Rows without a supervised token are not counted.
std::pair<int64_t, int64_t> first_answer_exact_match(MultimodalLM& model, const ModelInputs& in) {
  int64_t hits = 0, counted = 0, image_offset = 0;
  const at::Tensor ids = in.input_ids.cpu(), labels = in.labels.cpu();
  const int64_t per_image = model.config.vision ? model.config.image_seq_length() : 0;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row_ids = ids[b], row_labels = labels[b];
    const int64_t n_images = per_image > 0 ? row_ids.eq(model.config.image_token_id).sum().item<int64_t>() / per_image : 0;
    const at::Tensor sup = row_labels.ne(-100).nonzero().reshape({-1});
    if (sup.numel() == 0) {
      image_offset += n_images;
      continue;
    }
    const int64_t start = sup[0].item<int64_t>();
    int64_t end = start;
    while (end < row_labels.size(0) && row_labels[end].item<int64_t>() != -100) ++end;
    ModelInputs prompt;
    prompt.input_ids = in.input_ids.narrow(0, b, 1).narrow(1, 0, start);
    if (in.token_roles.defined()) prompt.token_roles = in.token_roles.narrow(0, b, 1).narrow(1, 0, start);
    if (n_images > 0) prompt.pixel_values = in.pixel_values.narrow(0, image_offset, n_images);
    image_offset += n_images;
    GenerateOptions g;
    g.max_new_tokens = end - start;
    g.eos_token_id = -1;  // generate exactly the answer's length
    const GenerateResult r = generate(model, prompt, g);
    hits += r.tokens.cpu()[0].narrow(0, 0, end - start).equal(row_ids.narrow(0, start, end - start)) ? 1 : 0;
    ++counted;
  }
  return {hits, counted};
}

}  // namespace

json Trainer::evaluate() {
  if (!eval_set_) return json::object();
  model_->eval();
  LoaderConfig lc{cfg_.batch.micro_batch, rank_, world_, SamplerConfig{cfg_.seed, int64_t(world_) * cfg_.batch.micro_batch,
                                                                       false, 0},
                  cfg_.data.workers, cfg_.data.prefetch, -1, 1.0, 200, false};
  DataLoader loader(*eval_set_, lc);
  int64_t batches = loader.micro_steps_per_epoch();
  if (cfg_.eval.max_batches > 0) batches = std::min<int64_t>(batches, cfg_.eval.max_batches);
  const size_t n_mod = mod_layers_.size();
  // [lm_sum, supervised, samples, exact hits, exact counted, processed..., entered...]
  at::Tensor packed = at::zeros({5 + 2 * int64_t(n_mod)}, at::TensorOptions().dtype(at::kDouble));
  auto acc = packed.accessor<double, 1>();
  {
    torch::NoGradGuard no_grad;
    for (int64_t k = 0; k < batches; ++k) {
      Batch b = loader.next();
      if (b.empty()) continue;
      ModelInputs in = to_model_inputs(b, device_);
      if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(dtype_);
      ForwardState st;
      ModelOutput out = model_->forward(in, st);
      acc[0] += out.lm_loss_sum.item<double>();
      acc[1] += double(out.supervised_tokens);
      acc[2] += double(b.size());
      for (const LayerTokens& lt : st.tokens)
        for (size_t i = 0; i < n_mod; ++i)
          if (lt.layer == mod_layers_[i]) acc[5 + i] += double(lt.processed), acc[5 + n_mod + i] += double(lt.total);
      if (cfg_.eval.exact_match) {
        const auto [hits, counted] = first_answer_exact_match(*model_, in);
        acc[3] += double(hits);
        acc[4] += double(counted);
      }
    }
  }
  model_->train();
  packed = packed.to(device_);
  comm_->all_reduce(packed, ReduceOp::Sum);
  packed = packed.cpu();
  auto r = packed.accessor<double, 1>();
  json out{{"loss", r[0] / std::max(1.0, r[1])}, {"supervised_tokens", int64_t(r[1])}, {"samples", int64_t(r[2])}};
  if (cfg_.eval.exact_match) out["exact_match"] = r[3] / std::max(1.0, r[4]), out["exact_match_samples"] = int64_t(r[4]);
  if (n_mod > 0) {
    json sr = json::object();
    for (size_t i = 0; i < n_mod; ++i)
      if (r[5 + n_mod + i] > 0) sr[std::to_string(mod_layers_[i])] = 1.0 - r[5 + i] / r[5 + n_mod + i];
    out["skip_ratio"] = sr;
  }
  return out;
}

}  // namespace gmod

// Test helper for the gmod::mod decode tests (test_generate.cpp, test_routing_rule.cpp): cached generation
// against a full recompute with the same routing decisions, and which decode-step paths the run went through.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mod/conversion.h"
#include "mod/generate.h"
#include "mod/mod_layer.h"
#include "model/token_roles.h"

namespace gmod::test {

struct DecodeCases {
  int64_t none = 0, some = 0,
          all = 0;         // (MoD layer, decode step) pairs where no / some / every live sample processed
  int64_t split_runs = 0;  // pairs where the processing samples are not consecutive (several runs)
  int64_t skipped_prefill = 0;  // real prompt tokens some MoD layer skipped
  int64_t skipped_decode = 0;   // (MoD layer, live fed token) pairs skipped
};

// Cached generation (`o`, with the cache and each step's logits) of a model with MoD layers against one full
// forward of prompt + generated tokens with the routing decisions replayed (prefill decisions [B, L] followed
// by one [B, 1] per fed token): every live sample's logits at every step within 1e-4. With an EOS, samples
// stop at different steps; a finished sample's later steps feed pad tokens (masked) and are not compared.
inline DecodeCases expect_replay_equal(MultimodalLM& model, const ModelInputs& p, GenerateOptions o) {
  auto layers = mod_layers(model);
  for (auto& l : layers) {
    l->forced_selection = at::Tensor();
    l->recorded.clear();
    l->record_selection = true;
  }
  o.use_cache = true;
  o.keep_logits = true;
  auto cached = generate(model, p, o);
  const int64_t B = p.input_ids.size(0), L = p.input_ids.size(1), T = cached.tokens.size(1);
  EXPECT_EQ(cached.decode_steps, T - 1);

  // Live samples at step t (the token fed at step t is real): t < length.
  auto live = at::arange(T).unsqueeze(0) < cached.lengths.unsqueeze(1);  // [B, T]
  DecodeCases cases;
  auto valid = p.attention_mask;
  for (auto& l : layers) {
    EXPECT_EQ(static_cast<int64_t>(l->recorded.size()), T);
    cases.skipped_prefill += (valid & l->recorded[0].logical_not()).sum().item<int64_t>();
    for (int64_t t = 1; t < T; ++t) {
      auto fed_live = live.select(1, t - 1);
      auto proc = l->recorded[t].squeeze(1) & fed_live;
      const int64_t n = proc.sum().item<int64_t>(), n_live = fed_live.sum().item<int64_t>();
      cases.skipped_decode += n_live - n;
      if (n == 0)
        ++cases.none;
      else if (n == n_live)
        ++cases.all;
      else
        ++cases.some;
      auto where = proc.nonzero().squeeze(1);
      if (n > 1 && (where[-1] - where[0]).item<int64_t>() != n - 1) ++cases.split_runs;
    }
    l->forced_selection = at::cat(l->recorded, 1);
    l->record_selection = false;
  }

  auto n = valid.sum(1);
  ModelInputs full = p;
  auto fed = cached.tokens.narrow(1, 0, T - 1);
  full.input_ids = at::cat({p.input_ids, fed}, 1);
  full.attention_mask = at::cat({valid, live.narrow(1, 0, T - 1)}, 1);
  full.positions = at::cat(
      {at::arange(L).unsqueeze(0).expand({B, L}), n.unsqueeze(1) + at::arange(T - 1).unsqueeze(0)}, 1);
  auto fed_roles = at::where(live.narrow(1, 0, T - 1), static_cast<int64_t>(TokenRole::kAnswer),
                             static_cast<int64_t>(TokenRole::kPad))
                       .to(at::kChar);
  full.token_roles = at::cat({p.token_roles, fed_roles}, 1);
  at::NoGradGuard ng;
  auto logits = model.forward(full).logits;  // [B, L + T - 1, V]
  for (int64_t t = 0; t < T; ++t) {
    auto at_pos = t == 0 ? (n - 1) : at::full({B}, L + t - 1, at::kLong);
    auto ref = logits.gather(1, at_pos.view({B, 1, 1}).expand({B, 1, logits.size(2)})).squeeze(1);
    for (int64_t b = 0; b < B; ++b) {
      if (!live[b][t].item<bool>()) continue;  // finished: its logits are of pad tokens
      EXPECT_LT((cached.step_logits[t][b] - ref[b]).abs().max().item<double>(), 1e-4)
          << "step " << t << " sample " << b;
    }
  }
  for (auto& l : layers) l->forced_selection = at::Tensor();
  return cases;
}

}  // namespace gmod::test

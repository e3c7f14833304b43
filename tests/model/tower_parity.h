// Test helper for the parity tests of the vision-tower families against their original code
// (tests/model/test_llava_hr.cpp, test_mgm.cpp): the committed fixture's inputs, the towers frozen as the
// originals freeze them, and the two checks each family runs on every fixture: logits, loss and every
// parameter's gradient against the fp32 reference, and gmod's bf16 error against the original's bf16 error; and
// that checkpointing the tower's blocks gives bitwise the same tower gradients.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/hf_names.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"

namespace gmod::test {

// A fixture's JSON; a missing file names the generator that writes it.
inline nlohmann::json read_fixture_json(const std::string& path, const std::string& generator) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": missing (re-run " + generator + ")");
  nlohmann::json j;
  f >> j;
  return j;
}

// The reference batch: ids, mask, labels, explicit positions when the fixture has them, and the low-res
// pixels upsampled `repeat` times (the generators store them small).
inline ModelInputs tower_fixture_inputs(const SafetensorsFile& ref, int repeat) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  const auto names = ref.names();
  if (std::find(names.begin(), names.end(), "input.positions") != names.end())
    in.positions = ref.tensor("input.positions").clone();
  in.pixel_values =
      ref.tensor("input.pixels_lowres").repeat_interleave(repeat, 2).repeat_interleave(repeat, 3);
  return in;
}

// Towers frozen as LLaVA-HR and MGM freeze them: everything under vision. but what the tower marks trainable.
inline void freeze_towers(MultimodalLM& m) {
  for (auto& p : m.named_parameters())
    if (p.key().rfind("vision.", 0) == 0 && !m.vision->is_adapter(p.key().substr(7)))
      p.value().requires_grad_(false);
}

// Logits within 1e-5 on real tokens, loss within 1e-5, every reference gradient within 1e-5 relative to the
// tensor's own norm, every gmod parameter accounted for, and the parameters without a gradient in the
// original without one in gmod. `zero_true_grad`: name parts of parameters whose true gradient is exactly
// zero (softmax key biases): rounding noise on both sides, so those get an absolute floor instead.
inline void expect_fixture_parity(MultimodalLM& model, const ModelInputs& in, const SafetensorsFile& ref,
                                  const nlohmann::json& meta, const std::vector<std::string>& zero_true_grad,
                                  const std::string& label) {
  auto out = model.forward(in);
  auto valid = in.attention_mask.unsqueeze(-1).expand_as(out.logits);
  const double logit_err =
      (out.logits - ref.tensor("logits")).abs().masked_select(valid).max().item<double>();
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();

  auto params = model.named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto g = hf_to_gmod(name.substr(5));
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "reference parameter " << name.substr(5) << " has no gmod parameter";
      continue;
    }
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    if (!grad.defined()) {
      ADD_FAILURE() << *g << " has no gradient in gmod but has one in the original";
      continue;
    }
    const auto r = ref.tensor(name);
    const double diff = (grad - r).norm().item<double>(),
                 rel = diff / std::max(r.norm().item<double>(), 1e-30);
    const bool zero = std::any_of(zero_true_grad.begin(), zero_true_grad.end(), [&](const std::string& part) {
      return g->find(part) != std::string::npos;
    });
    EXPECT_TRUE(rel < 1e-5 || (zero && diff < 1e-9)) << "gradient of " << *g << ": relative L2 difference "
                                                     << rel << " (|ref| " << r.norm().item<double>() << ")";
    if (!zero && rel > worst) worst = rel, worst_name = *g;
    ++compared;
  }
  for (const auto& hf : meta.at("no_grad")) {
    const std::string n = hf.get<std::string>();
    if (hf_unused(n)) continue;  // e.g. the ConvNeXt classifier head: not held by gmod
    const auto g = hf_to_gmod(n);
    ASSERT_TRUE(g && params.contains(*g)) << n;
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    EXPECT_TRUE(!grad.defined() || grad.abs().max().item<double>() == 0.0)
        << *g << " has no gradient in the original but has one in gmod";
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_EQ(compared, meta.at("gradients").get<int>());
  std::cout << label << ": max logit diff " << logit_err << ", worst relative gradient diff " << worst << " ("
            << worst_name << ")\n";
}

// As for LLaVA-1.5 (test_hf_parity.cpp): gmod in bf16 must be as close to the fp32 truth as the original in
// bf16 (reference_bf16.safetensors holds the original's bf16 logits).
inline void expect_bf16_tracks_original(const std::string& dir, int pixel_repeat, const std::string& label) {
  auto model = load_pretrained(dir, at::kBFloat16);
  SafetensorsFile ref(dir + "/reference.safetensors"), ref16(dir + "/reference_bf16.safetensors");
  auto in = tower_fixture_inputs(ref, pixel_repeat);
  in.pixel_values = in.pixel_values.to(at::kBFloat16);
  at::NoGradGuard ng;
  auto out = model->forward(in);
  auto valid = in.attention_mask.unsqueeze(-1).expand_as(out.logits);
  auto err = [&](const at::Tensor& a) {
    return (a - ref.tensor("logits")).abs().masked_select(valid).max().item<double>();
  };
  const double ours = err(out.logits), theirs = err(ref16.tensor("logits").to(at::kFloat));
  EXPECT_LT(ours, 2.0 * theirs + 1e-3)
      << "gmod bf16 error " << ours << " vs the original's bf16 error " << theirs;
  std::cout << label << ": bf16 max logit error gmod " << ours << ", original " << theirs << "\n";
}

// The tower's activation checkpointing (recompute in the backward) gives bitwise the same gradient for every
// vision parameter as the plain backward, on the fixture in `dir` (its pixels repeated `pixel_repeat` times).
inline void expect_tower_checkpointing_bitwise(const std::string& dir, int pixel_repeat) {
  SafetensorsFile ref(dir + "/reference.safetensors");
  std::vector<at::Tensor> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    auto model = load_pretrained(dir);
    model->vision->set_activation_checkpointing(ck == 1);
    ModelInputs in = tower_fixture_inputs(ref, pixel_repeat);
    model->forward(in).lm_loss.backward();
    for (const auto& p : model->named_parameters())
      if (p.key().rfind("vision.", 0) == 0 && p.value().grad().defined()) grads[ck].push_back(p.value().grad());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  ASSERT_GT(grads[0].size(), 100u);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(grads[0][i].equal(grads[1][i])) << i;
}

}  // namespace gmod::test

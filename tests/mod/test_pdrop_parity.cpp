// gmod's PyramidDrop (mod/pdrop.h) against the ORIGINAL PyramidDrop modules (tests/fixtures/make_pdrop_fixtures.py
// imports LlavaLlamaForCausalLM_PDrop from a Cooperx521/PyramidDrop checkout and runs it at random tiny weights): the
// directory as the original saves it (model_type llava_llama), loaded by load_pretrained and converted with the
// original's stages (layer_list [2, 4, 5], ratios [0.5, 0.25, 0.125]), and
//   training (4 samples, padding, images and text-only, two turns, one sample without an answer): logits of every
//   token the original keeps to the end within 1e-5, the LM loss within 1e-5, the tokens each stage keeps exactly,
//   every parameter's gradient within 1e-5 relative L2 (4x the original's own fp32 error where that is larger);
//   inference (eval mode, one prompt): prefill logits and kept sets, and greedy decoding with the per-stage KV
//   caches holding only the kept tokens against the original's cached generation (tokens and every step's logits).
// The original's training fallback for a sample without an answer (keep every token) is pdrop_unanswered
// "keep_all"; gmod's default ranks such a sample by its last token, and the test shows both.
// Planted bugs (the ranking query one token late, a stage boundary one layer early, no renumbering of positions
// after a drop) must push the differences over the tolerances: the comparison can fail.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/hf_names.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/token_roles.h"
#include "mod/conversion.h"
#include "mod/generate.h"
#include "mod/pdrop.h"
#include "tests/common/paths.h"

using namespace gmod;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_pdrop_parity {
namespace {

constexpr int64_t kImageMarker = -200;  // the original's IMAGE_TOKEN_INDEX, kept in the stored expanded ids
constexpr double kTol = 1e-5;

std::string dir() { return test::fixture("pdrop"); }

const nlohmann::json& meta() {
  static const nlohmann::json j = [] {
    std::ifstream f(dir() + "/reference.json");
    if (!f) throw std::runtime_error(dir() + "/reference.json: missing (re-run tests/fixtures/make_pdrop_fixtures.py)");
    nlohmann::json m;
    f >> m;
    return m;
  }();
  return j;
}

SafetensorsFile& ref() {
  static SafetensorsFile f(dir() + "/reference.safetensors");
  return f;
}

double logit_tol(const at::Tensor& r) { return kTol * std::max(1.0, r.abs().max().item<double>()); }

MoDConfig original_config(PDropUnanswered unanswered = PDropUnanswered::kKeepAll) {
  MoDConfig c = pdrop_config(meta().at("layer_list").get<std::vector<int>>(),
                             meta().at("ratios").get<std::vector<double>>(), meta().at("num_layers").get<int>());
  c.pdrop_unanswered = unanswered;
  return c;
}

std::shared_ptr<MultimodalLM> load(const MoDConfig& c) {
  auto m = load_pretrained(dir());
  for (auto& p : m->named_parameters(true))  // the CLIP is frozen in the original
    if (p.key().rfind("vision.", 0) == 0) p.value().set_requires_grad(false);
  convert_to_mod(*m, c);
  for (auto& l : mod_layers(*m)) l->record_selection = true;
  return m;
}

ModelInputs inputs(const std::string& tag, int64_t image_id) {
  ModelInputs in;
  auto ids = ref().tensor(tag + ".input.input_ids");
  in.input_ids = ids.masked_fill(ids == kImageMarker, image_id);
  in.token_roles = ref().tensor(tag + ".input.token_roles").to(at::kChar);
  if (ref().has(tag + ".input.labels")) in.labels = ref().tensor(tag + ".input.labels").clone();
  if (ref().has(tag + ".input.attention_mask"))
    in.attention_mask = ref().tensor(tag + ".input.attention_mask").to(at::kBool);
  in.pixel_values = ref().tensor(tag + ".input.pixels").clone();
  return in;
}

double rel_l2(const at::Tensor& a, const at::Tensor& r) {
  return (a - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

struct Diffs {
  double logits = 0, loss = 0, grad = 0, grad_rel = 0;  // grad: in units of each tensor's tolerance x kTol
  int64_t kept_diffs = 0;                 // tokens kept differently, over every stage
  std::vector<int64_t> kept_by_sample;   // the same per sample
  int compared = 0;
  std::string worst;
};

// Kept sets of each stage (the selection of its first layer, and every later layer of the stage the same) and the
// logits of the finally kept tokens, against the reference of `tag`.
void compare_forward(MultimodalLM& model, const ModelOutput& out, const ModelInputs& in, const std::string& tag,
                     Diffs& d) {
  const auto cfg = mod_layers(model).front()->cfg;
  const auto valid = in.attention_mask.defined() ? in.attention_mask : at::ones_like(in.input_ids, at::kBool);
  const int64_t B = in.input_ids.size(0);
  d.kept_by_sample.assign(size_t(B), 0);
  for (auto& l : mod_layers(model)) EXPECT_FALSE(l->recorded.empty());
  const auto layers = mod_layers(model);
  const int first = cfg.mod_layers.front();
  for (size_t s = 0; s < meta().at("layer_list").size(); ++s) {
    const auto want = ref().tensor(tag + ".kept.stage" + std::to_string(s + 1)).to(at::kBool);
    // The reference's stage s starts at its layer_list[s]; compare the layer gmod runs there.
    const int l = meta().at("layer_list")[s].get<int>();
    if (l < first || layers[size_t(l - first)]->recorded.empty()) {
      d.kept_diffs += want.logical_not().logical_and(valid).sum().item<int64_t>() + 1;
      continue;
    }
    const auto got = layers[size_t(l - first)]->recorded[0] & valid;
    const auto diff = (got != (want & valid)).sum(1);
    d.kept_diffs += diff.sum().item<int64_t>();
    for (int64_t b = 0; b < B; ++b) d.kept_by_sample[size_t(b)] += diff[b].item<int64_t>();
  }
  const auto final_kept = ref().tensor(tag + ".kept.stage" + std::to_string(meta().at("layer_list").size()))
                              .to(at::kBool) & valid;
  d.logits = (out.logits.detach() - ref().tensor(tag + ".logits")).abs().amax(-1).masked_select(final_kept).max()
                 .item<double>();
}

Diffs train_compare(MultimodalLM& model, const ModelInputs& in, bool grads) {
  Diffs d;
  model.train();
  model.zero_grad();
  ForwardState st;
  auto out = model.forward(in, st);
  EXPECT_TRUE(st.aux_losses.empty()) << "PyramidDrop has no routing loss";
  compare_forward(model, out, in, "train", d);
  d.loss = std::abs(out.lm_loss.item<double>() - ref().tensor("train.loss").item<double>());
  if (!grads) return d;
  out.lm_loss.backward();
  auto params = model.named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  for (const auto& name : ref().names()) {
    const std::string pre = "train.grad.";
    if (name.rfind(pre, 0) != 0) continue;
    const std::string hf = name.substr(pre.size());
    const auto g = hf_to_gmod(hf);
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "reference parameter " << hf << " has no gmod parameter";
      continue;
    }
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    const double rel = grad.defined() ? rel_l2(grad, ref().tensor(name)) : 1.0;
    const double tol = std::max(kTol, 4 * meta().at("fp32_rounding").value(hf, 0.0));
    d.grad_rel = std::max(d.grad_rel, rel);
    if (rel * kTol / tol > d.grad) {  // in units of each tensor's own tolerance, times kTol
      d.grad = rel * kTol / tol;
      d.worst = *g + " (relative L2 " + std::to_string(rel) + ", tolerance " + std::to_string(tol) + ")";
    }
    ++d.compared;
  }
  for (const auto& hf : meta().at("no_grad")) {
    const auto g = hf_to_gmod(hf.get<std::string>());
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "no-gradient parameter " << hf << " has no gmod parameter";
      continue;
    }
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    EXPECT_TRUE(!grad.defined() || grad.abs().max().item<double>() == 0.0) << *g << " has a gradient in gmod only";
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  return d;
}

void report(const std::string& what, const Diffs& d) {
  std::cout << "PyramidDrop parity " << what << ": max logit diff " << d.logits << ", LM loss diff " << d.loss
            << ", kept-token differences " << d.kept_diffs << ", worst gradient diff (in units of its tolerance x "
            << kTol << ") " << d.grad << " (" << d.worst << "), largest relative L2 " << d.grad_rel << " over "
            << d.compared << " tensors\n";
}

void expect_match(const Diffs& d, bool grads) {
  // 1e-5 of the largest logit, or 4x the original's own fp32 error on its logits (against its float64 copy, 5.3e-5
  // here: the sharp random attention amplifies rounding), whichever is larger.
  const double own = meta().at("fp32_rounding").value("logits", 0.0);
  EXPECT_LT(d.logits, std::max(logit_tol(ref().tensor("train.logits")), 4 * own))
      << "max abs logit difference (kept tokens); the original's own fp32 error " << own;
  EXPECT_LT(d.loss, kTol) << "LM loss";
  EXPECT_EQ(d.kept_diffs, 0) << "tokens kept differently";
  if (grads) {
    EXPECT_LT(d.grad, kTol) << "worst gradient: " << d.worst;
    EXPECT_EQ(d.compared, meta().at("gradients").get<int>());
  }
}

}  // namespace

TEST(PDropParity, TrainingMatchesTheOriginal) {
  auto model = load(original_config());
  const auto in = inputs("train", model->config.image_token_id);
  const auto d = train_compare(*model, in, true);
  report("training (pdrop_unanswered keep_all, as the original)", d);
  expect_match(d, true);
  // Every layer of a stage processes what its first layer kept.
  const auto layers = mod_layers(*model);
  for (size_t i = 1; i < layers.size(); ++i) {
    const int l = layers[i]->cfg.mod_layers[i];
    if (!pdrop_boundary(layers[i]->cfg, l)) {
      EXPECT_TRUE(at::equal(layers[i]->recorded[0], layers[i - 1]->recorded[0])) << "layer " << l;
    }
  }
}

TEST(PDropParity, UnansweredSampleDefaultRanksByItsLastTokenTheOriginalKeepsAll) {
  // Sample 3 has an image and no answer. The original (training) prints "index_before_answer is []" and keeps all
  // of its tokens at every stage; gmod's default ranks it by its last token as at inference. The other samples, the
  // loss (sample 3 has no supervised token) and the gradients are the same either way.
  auto model = load(original_config(PDropUnanswered::kLastToken));
  const auto in = inputs("train", model->config.image_token_id);
  const auto d = train_compare(*model, in, true);
  report("training, default pdrop_unanswered last_token", d);
  ASSERT_EQ(d.kept_by_sample.size(), 4u);
  EXPECT_EQ(d.kept_by_sample[0] + d.kept_by_sample[1] + d.kept_by_sample[2], 0);
  const int64_t n_img = meta().at("image_tokens").get<int64_t>();
  int64_t dropped = 0;  // what the default drops of sample 3 at stages 1..3, which the original keeps
  for (double r : meta().at("ratios").get<std::vector<double>>()) dropped += n_img - pdrop_kept_images(n_img, r);
  EXPECT_EQ(d.kept_by_sample[3], dropped);
  EXPECT_LT(d.loss, kTol);
  EXPECT_LT(d.grad, kTol) << d.worst;
}

TEST(PDropParity, InferenceMatchesTheOriginalWithItsKVCache) {
  auto model = load(original_config(PDropUnanswered::kLastToken));
  model->eval();
  const auto in = inputs("infer", model->config.image_token_id);
  Diffs d;
  {
    at::NoGradGuard ng;
    ForwardState st;
    auto out = model->forward(in, st);
    compare_forward(*model, out, in, "infer", d);
  }
  EXPECT_EQ(d.kept_diffs, 0);
  EXPECT_LT(d.logits, logit_tol(ref().tensor("infer.logits")));
  GenerateOptions opt;
  opt.max_new_tokens = meta().at("infer_new_tokens").get<int64_t>();
  opt.eos_token_id = -1;
  opt.keep_logits = true;
  opt.use_cache = true;
  const auto g = generate(*model, in, opt);
  const auto want = ref().tensor("infer.tokens").to(at::kLong);
  EXPECT_TRUE(at::equal(g.tokens[0].narrow(0, 0, want.size(0)), want)) << g.tokens << want;
  const auto scores = ref().tensor("infer.scores");
  double err = 0;
  ASSERT_EQ(static_cast<int64_t>(g.step_logits.size()), scores.size(0));
  for (size_t s = 0; s < g.step_logits.size(); ++s)
    err = std::max(err, (g.step_logits[s][0] - scores[int64_t(s)]).abs().max().item<double>());
  EXPECT_LT(err, logit_tol(scores)) << "decode logits against the original's cached generation";
  // The KV cache of each stage's layers holds only its kept tokens: the prefill processed exactly them.
  const auto counts = meta().at("infer_kept_per_stage").get<std::vector<int64_t>>();
  const auto& cfg = mod_layers(*model).front()->cfg;
  for (int l : cfg.mod_layers) {
    const auto it = std::find_if(g.layer_tokens.begin(), g.layer_tokens.end(),
                                 [&](const LayerTokens& t) { return t.layer == l; });
    ASSERT_NE(it, g.layer_tokens.end());
    int s = 0;
    for (size_t i = 0; i < cfg.pdrop_layers.size(); ++i)
      if (cfg.pdrop_layers[i] <= l) s = static_cast<int>(i);
    EXPECT_EQ(it->processed, counts[size_t(s)]) << "prefill tokens of layer " << l;
  }
  std::cout << "PyramidDrop inference: prefill max logit diff " << d.logits << ", kept differences " << d.kept_diffs
            << ", cached decode max logit diff " << err << " over " << g.step_logits.size() << " steps\n";
}

TEST(PDropParity, PlantedBugsTurnTheComparisonRed) {
  {  // the ranking query one token late: the first answer token instead of the last instruction token
    auto model = load(original_config());
    auto in = inputs("train", model->config.image_token_id);
    const auto answer = in.token_roles == static_cast<int64_t>(TokenRole::kAnswer);
    auto prev = at::zeros_like(answer);
    prev.narrow(1, 1, answer.size(1) - 1).copy_(answer.narrow(1, 0, answer.size(1) - 1));
    const auto first_answer = answer & prev.logical_not();
    in.token_roles = in.token_roles.masked_fill(first_answer, static_cast<int64_t>(TokenRole::kQuestion));
    const auto d = train_compare(*model, in, true);
    report("PLANTED ranking query one token late", d);
    EXPECT_GT(d.kept_diffs, 0);
    EXPECT_GT(d.logits, kTol);
    EXPECT_GT(d.grad, kTol);
  }
  {  // a stage boundary one layer early: stage 2 from layer 3 instead of 4
    auto c = original_config();
    c.pdrop_layers[1] -= 1;
    auto model = load(c);
    const auto d = train_compare(*model, inputs("train", model->config.image_token_id), true);
    report("PLANTED stage boundary one layer early", d);
    EXPECT_GT(d.kept_diffs, 0);
    EXPECT_GT(d.logits, kTol);
    EXPECT_GT(d.grad, kTol);
    EXPECT_GT(d.loss, kTol);
  }
  {  // positions not renumbered after a drop (the kept tokens keep their original RoPE positions)
    auto c = original_config();
    c.rope_positions = RopePositions::kOriginal;
    auto model = load(c);
    const auto d = train_compare(*model, inputs("train", model->config.image_token_id), true);
    report("PLANTED original positions after a drop", d);
    EXPECT_GT(d.kept_diffs, 0);  // the later stages rank with other positions
    EXPECT_GT(d.logits, kTol);
    EXPECT_GT(d.grad, kTol);
  }
}

}  // namespace test_pdrop_parity

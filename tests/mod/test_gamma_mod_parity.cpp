// gmod's γ-MoD against the ORIGINAL γ-MoD modules (MoDLLaVALlamaForCausalLM imported from a Gamma-MOD checkout and
// run at random tiny weights), on two fixtures:
//   llava_clip_mod12 (tests/fixtures/make_gamma_mod_fixtures.py): LLaVA-1.5 style, one CLIP, MoD layers 1 and 2;
//   llava_hr_arank (tests/fixtures/make_gamma_mod_hr_fixtures.py): the layout of the released γ-MoD-LLaVA-HR models
//     (fine_tune_mod.sh: arank_mod on 6 layers -> 3 and 4, the multipath CLIP + ConvNeXt tower at 1024 px with
//     its stitches trained, the ConvNeXt named by a relative path in timm's layout).
// Each is a directory as the original saves it (model_type mod_llava_llama, config.mod, one router copy per MoD
// layer, the towers named by relative paths) loaded unedited by load_mod_pretrained (no image_token_id in the
// config: gmod's placeholder is then vocab_size), the same batch in training mode, and
//   logits within 1e-5 of the largest reference logit (every token is real: no padding; the committed reference
//   holds the generating CPU's fp32 rounding through a CLIP tower and 4 layers, and another CPU's kernels, AVX2 or
//   AVX-512, sum in another order: 4.2e-6 where it was made, 1.15e-5 on an AVX-512 CI machine, |logit| <= 4), LM loss and routing loss within 1e-5 / 1e-7,
//   the tokens each MoD layer selects exactly, and every parameter's gradient of lm + λ Σ_l ℓ_l within 1e-5 of the
//   reference relative to the tensor's own norm (the original's loss, λ = router_aux_loss_coef).
// The gmod MoD options that reproduce the official code are its defaults, asserted here: γ-MoD shared router,
// skip_frac 0.5 (the code's hard-coded 0.5; capacity_factor is not read), forced keep = questions + answers (the
// code keeps everything after the routable prefix), compacted RoPE positions, MLP-only scaling by p, routing CE
// averaged over every valid position (= all B·L here), λ = 0.01 from config.mod. The official routable prefix is a
// constant (1024 image + 35 instruction tokens); the fixture's roles are exactly that prefix.
// Inference (EvalMoDLLaVALlamaForCausalLM, batch 1): the original thresholds p > 0.005 over EVERY token, questions
// and answers included; gmod forces the non-routable tokens (docs/mod.md). The test checks that the routable part
// of the decisions is the same, that the only difference is the text tokens the original skips, and, with the
// original's kept set replayed (forced_selection), the inference logits.
// llava_hr_arank also holds a padded batch with a text-only sample (GammaModParityHr, below): where the original's
// hard-coded routable prefix makes it route that sample's questions, answers and padding, and parity otherwise.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "model/hf_names.h"
#include "model/llava.h"
#include "model/safetensors.h"
#include "model/token_roles.h"
#include "tests/common/paths.h"
#include "tests/mod/gamma_mod_reference.h"

using namespace gmod;
// 1e-5 relative to the largest reference logit (at least 1e-5): the committed reference holds one CPU's
// rounding.
using gmod::test::gamma_mod_ref::logit_tolerance;

namespace {

constexpr int64_t kImageMarker = -200;  // the original's IMAGE_TOKEN_INDEX, kept in the stored expanded ids

class GammaModParity : public ::testing::TestWithParam<std::string> {
 protected:
  std::string fixture_dir() const { return test::fixture("gamma_mod/" + GetParam()); }
  nlohmann::json read(const std::string& file) const {
    std::ifstream f(fixture_dir() + "/" + file);
    if (!f) throw std::runtime_error(fixture_dir() + "/" + file + ": missing (re-run its generator)");
    nlohmann::json j;
    f >> j;
    return j;
  }
  nlohmann::json meta() const { return read("reference.json"); }
};

ModelInputs fixture_inputs(const SafetensorsFile& ref, int64_t image_id, int repeat, int64_t rows = -1) {
  ModelInputs in;
  auto ids = ref.tensor("input.input_ids");
  in.input_ids = ids.masked_fill(ids == kImageMarker, image_id);
  in.labels = ref.tensor("input.labels").clone();
  in.token_roles = ref.tensor("input.token_roles").to(at::kChar);
  in.pixel_values = ref.tensor("input.pixels_lowres").repeat_interleave(repeat, 2).repeat_interleave(repeat, 3);
  if (rows > 0) {
    in.input_ids = in.input_ids.narrow(0, 0, rows).clone();
    in.labels = in.labels.narrow(0, 0, rows).clone();
    in.token_roles = in.token_roles.narrow(0, 0, rows).clone();
    in.pixel_values = in.pixel_values.narrow(0, 0, rows).clone();
  }
  in.attention_mask = at::ones_like(in.input_ids, at::kBool);
  return in;
}

// [B, L] bool from sorted positions [B, k].
at::Tensor selection_mask(const at::Tensor& idx, int64_t L) {
  return at::zeros({idx.size(0), L}, at::kBool).scatter(1, idx, true);
}

double rel_l2(const at::Tensor& a, const at::Tensor& ref) {
  return (a - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-30);
}

struct GradientReport {
  int compared = 0;
  double worst = 0;  // the largest relative L2 difference (the CLIP key biases aside)
  std::string worst_name;
  double worst_tol = 0;  // its tolerance
};

// Every reference tensor `<prefix><hf name>` against the gradient of gmod's parameter of that name (the original's
// router copies all map to the one shared router), within 1e-5 relative L2, or 4x the original's own float32 error
// against float64 where `fp32_rounding` lists it (hf name -> relative L2); marks each gmod parameter seen.
GradientReport compare_gradients(MultimodalLM& model, const SafetensorsFile& ref, const std::string& prefix,
                                 std::map<std::string, bool>& covered,
                                 const nlohmann::json& fp32_rounding = nlohmann::json::object()) {
  GradientReport rep;
  auto params = model.named_parameters();
  const auto router = shared_router(model);
  for (const auto& name : ref.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string hf = name.substr(prefix.size());
    at::Tensor grad;
    std::string g;
    if (hf_router_layer(hf)) {  // the one shared router (named after the first MoD layer by the original)
      g = "mod_router.weight";
      grad = router->weight.grad();
    } else {
      const auto gm = hf_to_gmod(hf);
      if (!gm || !params.contains(*gm)) {
        ADD_FAILURE() << "reference parameter " << hf << " has no gmod parameter";
        continue;
      }
      g = *gm;
      grad = params[g].grad();
    }
    covered[g] = true;
    if (!grad.defined()) {
      ADD_FAILURE() << g << " has no gradient in gmod but has one in the original";
      continue;
    }
    const auto r = ref.tensor(name);
    const double rel = rel_l2(grad, r);
    // CLIP's key biases: softmax is invariant to them, the true gradient is exactly 0 and both sides hold rounding
    // noise (as in tests/model/tower_parity.h): an absolute floor instead (|ref| 1e-9 here; the other gradients'
    // norms are 3e-4 to 2).
    const bool zero_true_grad = g.find("k_proj.bias") != std::string::npos;
    const double abs_diff = (grad - r).norm().item<double>();
    const double tol = std::max(1e-5, 4 * fp32_rounding.value(hf, 0.0));
    EXPECT_TRUE(rel < tol || (zero_true_grad && abs_diff < 1e-7))
        << prefix << ": gradient of " << g << ": relative L2 difference " << rel << " (|ref| "
        << r.norm().item<double>() << ", |diff| " << abs_diff << ")";
    if (!zero_true_grad && rel > rep.worst) rep.worst = rel, rep.worst_name = g, rep.worst_tol = tol;
    ++rep.compared;
  }
  return rep;
}

// The MoD config the original's config.json gives, and the switches that reproduce the official code.
void expect_official_options(const MoDConfig& c, const nlohmann::json& m, const nlohmann::json& config) {
  EXPECT_EQ(c.mod_layers, m.at("mod_layers").get<std::vector<int>>());
  EXPECT_EQ(c.selection, config.at("mod").at("mod_mode").get<std::string>());
  EXPECT_EQ(c.router, RouterKind::kGammaShared);
  EXPECT_EQ(c.skip_frac, 0.5);
  EXPECT_EQ(c.forced_keep, ForcedKeep::kQuestionsAnswers);
  EXPECT_EQ(c.rope_positions, RopePositions::kCompacted);
  EXPECT_TRUE(c.scale_by_router);
  EXPECT_EQ(c.router_aux_loss_coef, 0.01);
  EXPECT_EQ(c.infer_threshold, 0.005);
  EXPECT_EQ(c.mode, RoutingMode::kAuto);
}

TEST_P(GammaModParity, TrainingLogitsLossesRoutingAndEveryGradientMatchTheOriginal) {
  const auto dir = fixture_dir();
  const auto m = meta();
  const auto config = read("config.json");
  const auto mc = read_mod_config(dir);
  ASSERT_TRUE(mc);
  expect_official_options(*mc, m, config);
  auto model = load_mod_pretrained(dir);
  ASSERT_TRUE(model->vision);
  // The tower the directory names: LLaVA-HR's multipath (CLIP + ConvNeXt) where config.json says so.
  EXPECT_EQ(model->config.multipath.has_value(), config.value("is_multipath_encoder", false));
  ASSERT_TRUE(shared_router(*model));
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = fixture_inputs(ref, model->config.image_token_id, m.at("pixel_repeat").get<int>());
  const int64_t L = in.input_ids.size(1);
  ASSERT_EQ(L, m.at("seq_len").get<int64_t>());

  model->train();
  auto layers = mod_layers(*model);
  ASSERT_EQ(layers.size(), mc->mod_layers.size());
  for (auto& l : layers) l->record_selection = true;
  ForwardState st;
  auto out = model->forward(in, st);
  const auto routing = total_routing_loss(st, *mc);
  ASSERT_TRUE(routing.defined());

  const double logit_err = (out.logits - ref.tensor("logits")).abs().max().item<double>();
  EXPECT_LT(logit_err, logit_tolerance(ref.tensor("logits"))) << "max abs logit difference (every token)";
  const double lm_err = std::abs(out.lm_loss.item<double>() - ref.tensor("lm_loss").item<double>());
  EXPECT_LT(lm_err, 1e-5) << "LM loss";
  const double rl_err = std::abs(routing.item<double>() - ref.tensor("routing_loss").item<double>());
  EXPECT_LT(rl_err, 1e-7) << "routing loss λ Σ_l ℓ_l";
  ASSERT_EQ(st.aux_losses.size(), mc->mod_layers.size());
  double layer_loss_err = 0;
  int64_t selection_diffs = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto tag = "layer" + std::to_string(mc->mod_layers[i]);
    const double e =
        std::abs(st.aux_losses[i].item<double>() - ref.tensor("routing_loss." + tag).item<double>());
    layer_loss_err = std::max(layer_loss_err, e);
    EXPECT_LT(e, 1e-5) << "routing CE of " << tag;
    const auto idx = ref.tensor("selected." + tag);
    EXPECT_EQ(idx.size(1), m.at("capacity").get<int64_t>());
    ASSERT_EQ(layers[i]->recorded.size(), 1u);
    const auto want = selection_mask(idx, L), got = layers[i]->recorded[0];
    const int64_t diff = (want != got).sum().item<int64_t>();
    selection_diffs += diff;
    EXPECT_EQ(diff, 0) << "tokens selected differently in " << tag;
    // Everything after the routable prefix is processed; floor(R / 2) of the prefix is skipped.
    const int64_t R = m.at("routable_prefix").get<int64_t>();
    EXPECT_TRUE(got.narrow(1, R, L - R).all().item<bool>()) << tag;
    EXPECT_EQ(got.narrow(1, 0, R).logical_not().sum(1).eq(R / 2).all().item<bool>(), true) << tag;
  }
  auto loss = out.lm_loss + routing;
  EXPECT_NEAR(loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  loss.backward();

  auto params = model->named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  const auto gr = compare_gradients(*model, ref, "grad.", covered);
  const int compared = gr.compared;
  const double worst = gr.worst;
  const std::string worst_name = gr.worst_name;
  const auto router = shared_router(*model);
  for (const auto& hf : m.at("no_grad")) {
    if (hf_unused(hf.get<std::string>())) {  // the ConvNeXt's classifier head: unused, gmod does not hold it
      const auto g = hf_to_gmod(hf.get<std::string>());
      EXPECT_FALSE(g && params.contains(*g)) << hf;
      continue;
    }
    const auto g = hf_to_gmod(hf.get<std::string>());
    ASSERT_TRUE(g && params.contains(*g)) << hf;
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    EXPECT_TRUE(!grad.defined() || grad.abs().max().item<double>() == 0.0)
        << *g << " has no gradient in the original but has one in gmod";
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_EQ(compared, m.at("gradients").get<int>());
  EXPECT_GT(router->weight.grad().norm().item<double>(), 0.0);
  std::cout << "γ-MoD training parity (" << GetParam() << "): max logit diff " << logit_err << ", LM loss diff " << lm_err
            << ", routing loss diff " << rl_err << " (per layer " << layer_loss_err << "), selection differences "
            << selection_diffs << ", worst relative gradient diff " << worst << " (" << worst_name << ") over "
            << compared << " tensors\n";
}

TEST_P(GammaModParity, InferenceDecisionsAndLogitsMatchTheOriginalUpToForcedTokens) {
  const auto dir = fixture_dir();
  const auto m = meta();
  const auto mc = read_mod_config(dir);
  ASSERT_TRUE(mc);
  auto model = load_mod_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = fixture_inputs(ref, model->config.image_token_id, m.at("pixel_repeat").get<int>(), 1);
  in.labels = at::Tensor();
  const int64_t L = in.input_ids.size(1), R = m.at("routable_prefix").get<int64_t>();
  model->eval();
  at::NoGradGuard ng;
  auto layers = mod_layers(*model);
  for (auto& l : layers) l->record_selection = true;
  model->forward(in);  // gmod's own inference decisions
  std::vector<at::Tensor> official;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto tag = "layer" + std::to_string(mc->mod_layers[i]);
    const auto kept = ref.tensor("eval.kept." + tag).unsqueeze(0);
    official.push_back(selection_mask(kept, L));
    const auto got = layers[i]->recorded.at(0);
    // The routable prefix: the same threshold decisions.
    EXPECT_TRUE(at::equal(got.narrow(1, 0, R), official[i].narrow(1, 0, R))) << tag;
    // After it gmod processes every token; the original skips the ones under the threshold.
    EXPECT_TRUE(got.narrow(1, R, L - R).all().item<bool>()) << tag;
    EXPECT_EQ(official[i].narrow(1, R, L - R).logical_not().sum().item<int64_t>(),
              m.at("eval_text_skipped").at(std::to_string(mc->mod_layers[i])).get<int64_t>())
        << tag;
  }
  // The original's decisions replayed: gmod's inference block (compacted positions, MLP x p) gives its logits.
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->forced_selection = official[i];
  auto out = model->forward(in);
  const double err = (out.logits - ref.tensor("eval.logits")).abs().max().item<double>();
  EXPECT_LT(err, logit_tolerance(ref.tensor("eval.logits"))) << "inference logits with the original's kept tokens";
  std::cout << "γ-MoD inference parity (" << GetParam() << ", original's decisions replayed): max logit diff " << err
            << "\n";
}

// The released layout's fixture also holds the original on a padded batch: the image sample and a text-only sample
// (LLaVA's collator pads it with pad_token_id; the splice aligns it with zero embeddings), both in training mode.
// The original's routable prefix is the hard-coded first 1059 positions of every row, so on the text-only row it
// routes the question and answer tokens and lets padding take capacity; gmod routes by role (image ∪ system) and
// never processes padding. Checked: gmod's own routing gives the image row the original's decisions and logits, and
// on the text-only row differs exactly there (docs/models.md); with the original's selection replayed
// (forced_selection), the logits of every real token, the LM loss and every gradient of the LM loss match.
TEST(GammaModParityHr, PaddedBatchWithATextOnlySample) {
  const auto dir = test::fixture("gamma_mod/llava_hr_arank");
  std::ifstream f(dir + "/reference.json");
  ASSERT_TRUE(f) << dir << "/reference.json (re-run make_gamma_mod_hr_fixtures.py)";
  nlohmann::json m;
  f >> m;
  const auto pm = m.at("padded");
  const auto mc = read_mod_config(dir);
  ASSERT_TRUE(mc);
  SafetensorsFile ref(dir + "/reference.safetensors");
  const int repeat = m.at("pixel_repeat").get<int>();
  auto make_inputs = [&](int64_t image_id) {
    ModelInputs in;
    auto ids = ref.tensor("padded.input.input_ids");
    in.input_ids = ids.masked_fill(ids == kImageMarker, image_id);
    in.labels = ref.tensor("padded.input.labels").clone();
    in.token_roles = ref.tensor("padded.input.token_roles").to(at::kChar);
    in.attention_mask = ref.tensor("padded.input.attention_mask").to(at::kBool);
    // One image: the text-only row's zero image is not spliced by the original either.
    in.pixel_values =
        ref.tensor("input.pixels_lowres").narrow(0, 0, 1).repeat_interleave(repeat, 2).repeat_interleave(repeat, 3);
    return in;
  };
  const auto want_logits = ref.tensor("padded.logits");
  const double tol = logit_tolerance(want_logits);

  // gmod's own routing.
  auto model = load_mod_pretrained(dir);
  model->train();
  auto in = make_inputs(model->config.image_token_id);
  const int64_t L = in.input_ids.size(1);
  const auto valid = in.attention_mask;
  const int64_t n_text = pm.at("text_only_tokens").get<int64_t>();
  ASSERT_EQ(valid[1].sum().item<int64_t>(), n_text);
  auto layers = mod_layers(*model);
  for (auto& l : layers) l->record_selection = true;
  ForwardState st;
  auto out = model->forward(in, st);
  const double row0_err = (out.logits[0] - want_logits[0]).abs().max().item<double>();
  EXPECT_LT(row0_err, tol) << "image row logits";
  std::vector<at::Tensor> original;
  const auto qa = in.token_roles[1].narrow(0, 0, n_text) >= static_cast<int8_t>(TokenRole::kQuestion);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto tag = "layer" + std::to_string(mc->mod_layers[i]);
    original.push_back(selection_mask(ref.tensor("padded.selected." + tag), L));
    const auto got = layers[i]->recorded.at(0);
    EXPECT_TRUE(at::equal(got[0], original[i][0])) << "image row selection, " << tag;
    // The text-only row: gmod processes every question and answer token and no padding.
    const auto got_real = got[1].narrow(0, 0, n_text);
    EXPECT_TRUE(got_real.masked_select(qa).all().item<bool>()) << tag;
    EXPECT_FALSE(got[1].narrow(0, n_text, L - n_text).any().item<bool>()) << tag;
    // The original skips some of them and spends its capacity on padding (the counts its generator recorded).
    const auto skipped = pm.at("text_only_skipped").at(std::to_string(mc->mod_layers[i]));
    const auto orig_real = original[i][1].narrow(0, 0, n_text);
    EXPECT_EQ(orig_real.logical_not().masked_select(qa).sum().item<int64_t>(),
              skipped.at("question_answer").get<int64_t>())
        << tag;
    EXPECT_GT(skipped.at("question_answer").get<int64_t>(), 0) << tag;
    EXPECT_EQ(original[i][1].narrow(0, n_text, L - n_text).sum().item<int64_t>(),
              skipped.at("padding_taken").get<int64_t>())
        << tag;
  }

  // The original's selection replayed: every real token's logits, the LM loss and every LM-loss gradient.
  model = load_mod_pretrained(dir);
  model->train();
  layers = mod_layers(*model);
  ASSERT_EQ(layers.size(), original.size());
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->forced_selection = original[i];
  out = model->forward(in);
  const double err = (out.logits - want_logits).abs().masked_select(valid.unsqueeze(-1)).max().item<double>();
  EXPECT_LT(err, tol) << "logits of the real tokens with the original's selection replayed";
  const double lm_err = std::abs(out.lm_loss.item<double>() - ref.tensor("padded.lm_loss").item<double>());
  EXPECT_LT(lm_err, 1e-5) << "LM loss";
  out.lm_loss.backward();
  std::map<std::string, bool> covered;
  // The LM-loss gradients of this batch come from one image: the ConvNeXt stem and first stages sum over 256 x 256
  // positions, where the original's own float32 error reaches 6e-6 (reference.json padded.fp32_rounding).
  const auto gr = compare_gradients(*model, ref, "padded.grad.", covered, pm.at("fp32_rounding"));
  EXPECT_EQ(gr.compared, pm.at("gradients").get<int>());
  std::cout << "γ-MoD padded batch with a text-only sample: image row logits " << row0_err
            << "; with the original's selection replayed: logits " << err << ", LM loss " << lm_err
            << ", worst relative gradient diff " << gr.worst << " (" << gr.worst_name << ", tolerance " << gr.worst_tol
            << ") over " << gr.compared << " tensors\n";
}

INSTANTIATE_TEST_SUITE_P(OriginalModules, GammaModParity,
                         ::testing::Values(std::string("llava_clip_mod12"), std::string("llava_hr_arank")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace

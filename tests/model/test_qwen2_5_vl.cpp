// Qwen2.5-VL parts against transformers on committed fixtures (tests/fixtures/make_qwen2_5_vl_fixtures.py):
// the vision encoder's merged features within 1e-5 max abs and the gradient of pixel_values and of every
// parameter within 1e-4 relative L2 (the tolerances of test_hf_parity.cpp), for two images of different grids
// and a video whose windows cut; the M-RoPE 3-D position ids exactly and their cos/sin tables within 1e-6.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <set>

#include "model/hf_names.h"
#include "model/json_file.h"
#include "model/llava.h"
#include "model/lm_loss.h"
#include "model/mrope.h"
#include "model/activation_checkpoint.h"
#include "model/unit_hooks.h"
#include "model/pretrained.h"
#include "model/qwen2_5_vl_vision.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_qwen2_5_vl {
namespace {

std::string vision_dir() { return test::fixture("qwen2_5_vl/vision"); }
std::string full_dir() { return test::fixture("qwen2_5_vl/full"); }  // the model: config and weights

// The encoder alone, from the model's config.json and its visual.* weights (the published names).
std::shared_ptr<Qwen25VisionEncoder> load_vision() {
  const auto dir = full_dir();
  const auto cfg = load_json_file(dir + "/config.json");
  auto enc = std::make_shared<Qwen25VisionEncoder>(
      Qwen25VisionConfig::from_json(cfg.at("vision_config"), dir + "/config.json"));
  enc->load(SafetensorsFile(dir + "/model.safetensors"), "visual.");
  return enc;
}

double rel_l2(const at::Tensor& a, const at::Tensor& ref) {
  return (a - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-30);
}

TEST(Qwen25Vision, FeaturesAndEveryGradientMatchTransformers) {
  auto enc = load_vision();
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  auto px = ref.tensor("input.pixel_values").clone().requires_grad_(true);
  auto out = enc->features(px, ref.tensor("input.grid_thw"));
  ASSERT_EQ(out.sizes(), ref.tensor("output").sizes());
  const double err = (out - ref.tensor("output")).abs().max().item<double>();
  EXPECT_LT(err, 1e-5) << "max abs feature difference (features up to "
                       << ref.tensor("output").abs().max().item<double>() << ")";
  (out * ref.tensor("upstream")).sum().backward();
  EXPECT_LT(rel_l2(px.grad(), ref.tensor("grad.pixel_values")), 1e-4) << "gradient of pixel_values";
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& p : enc->named_parameters()) {
    const auto name = "grad." + p.key();
    ASSERT_TRUE(ref.has(name)) << p.key() << " has no reference gradient";
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient in gmod";
    const double r = rel_l2(p.value().grad(), ref.tensor(name));
    EXPECT_LT(r, 1e-4) << "gradient of " << p.key();
    if (r > worst) worst = r, worst_name = p.key();
    ++compared;
  }
  int refs = 0;
  for (const auto& n : ref.names()) refs += n.rfind("grad.", 0) == 0 && n != "grad.pixel_values";
  EXPECT_EQ(compared, refs) << "every transformers parameter has a gmod parameter";
  std::cout << "Qwen2.5-VL vision: max feature diff " << err << ", worst relative gradient diff " << worst
            << " (" << worst_name << ")\n";
}

// The fixture exercises what it claims: windows that really cut (several per frame, of different sizes), full
// attention in some blocks and windows in the others, a video of two frames.
TEST(Qwen25Vision, FixtureWindowsCutAndBothAttentionKindsRun) {
  auto enc = load_vision();
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  const auto layout = Qwen25VisionLayout::of(ref.tensor("input.grid_thw"), enc->config);
  EXPECT_EQ(layout.frame_lengths, (std::vector<int64_t>{96, 16, 32, 32}));
  // 8x12 patches = 4x6 merge blocks in 3x3-block windows: 3x3, 3x3, 1x3, 1x3; 4x4: one; 4x8 video: 2x3 and
  // 2x1.
  EXPECT_EQ(layout.window_lengths, (std::vector<int64_t>{36, 36, 12, 12, 16, 24, 8, 24, 8}));
  EXPECT_FALSE(layout.window_index.equal(at::arange(layout.window_index.size(0), at::kLong)));
  EXPECT_EQ(enc->config.fullatt_block_indexes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(enc->config.depth, 4);
}

TEST(Qwen25Vision, BlockCheckpointingGivesBitwiseTheSameGradients) {
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  std::vector<at::Tensor> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    auto enc = load_vision();
    enc->set_activation_checkpointing(ck == 1);
    auto px = ref.tensor("input.pixel_values").clone().requires_grad_(true);
    (enc->features(px, ref.tensor("input.grid_thw")) * ref.tensor("upstream")).sum().backward();
    grads[ck].push_back(px.grad());
    for (const auto& p : enc->parameters()) grads[ck].push_back(p.grad());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(grads[0][i].equal(grads[1][i])) << i;
}

TEST(Qwen25Vision, ConfigReadsPublishedFieldsAndRejectsBadOnes) {
  // The published Qwen2.5-VL-7B vision_config spells the channels in_chans and has no rope_parameters.
  auto j = nlohmann::json::parse(
      R"({"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
    "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
    "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2, "temporal_patch_size": 2})");
  const auto c = Qwen25VisionConfig::from_json(j, "config.json");
  EXPECT_EQ(c.patch_dim(), 3 * 2 * 14 * 14);
  EXPECT_EQ(c.window_units(), 4);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.head_dim(), 80);
  j["fullatt_block_indexes"] = {7, 32};
  EXPECT_THROW(Qwen25VisionConfig::from_json(j, "config.json"), std::invalid_argument);
  j["fullatt_block_indexes"] = {7};
  j["window_size"] = 14;
  EXPECT_THROW(Qwen25VisionConfig::from_json(j, "config.json"), std::invalid_argument);
}

TEST(Qwen25Vision, RejectsGridsThatDoNotFitThePixels) {
  auto enc = load_vision();
  const auto dim = enc->config.patch_dim();
  EXPECT_THROW(enc->features(at::zeros({16, dim}), at::tensor({1, 4, 6}, at::kLong).view({1, 3})),
               std::invalid_argument);
  EXPECT_THROW(enc->features(at::zeros({12, dim}), at::tensor({1, 3, 4}, at::kLong).view({1, 3})),
               std::invalid_argument);
  EXPECT_THROW(enc->features(at::zeros({16, dim + 1}), at::tensor({1, 4, 4}, at::kLong).view({1, 3})),
               std::invalid_argument);
}

std::string mrope_dir() { return test::fixture("qwen2_5_vl/mrope"); }

MRopeConfig fixture_mrope_config() {
  const auto path = full_dir() + "/config.json";
  return MRopeConfig::from_json(load_json_file(path), path);
}

TEST(MRope, ConfigReadsTheFixtureAndPublishedLayouts) {
  const auto c = fixture_mrope_config();
  const auto meta = load_json_file(mrope_dir() + "/meta.json");
  EXPECT_EQ(c.image_token_id, meta.at("image_token_id").get<int64_t>());
  EXPECT_EQ(c.video_token_id, meta.at("video_token_id").get<int64_t>());
  EXPECT_EQ(c.spatial_merge_size, meta.at("spatial_merge_size").get<int64_t>());
  EXPECT_EQ(c.tokens_per_second, meta.at("tokens_per_second").get<int64_t>());
  EXPECT_EQ(c.mrope_section, meta.at("mrope_section").get<std::vector<int64_t>>());
  EXPECT_EQ(c.rope_theta, meta.at("rope_theta").get<double>());
  EXPECT_EQ(c.head_dim, meta.at("head_dim").get<int64_t>());
  // The published Qwen2.5-VL-7B config.json: text fields at the top, rope_scaling {type: mrope}.
  auto pub =
      nlohmann::json::parse(R"({"hidden_size": 3584, "num_attention_heads": 28, "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "image_token_id": 151655,
    "video_token_id": 151656, "vision_config": {"spatial_merge_size": 2, "tokens_per_second": 2}})");
  const auto p = MRopeConfig::from_json(pub, "config.json");
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.mrope_section, (std::vector<int64_t>{16, 24, 24}));
  pub["rope_scaling"]["mrope_section"] = {16, 24, 16};
  EXPECT_THROW(MRopeConfig::from_json(pub, "config.json"), std::invalid_argument);
}

TEST(MRope, PositionIdsAndDeltasEqualTransformers) {
  SafetensorsFile ref(mrope_dir() + "/reference.safetensors");
  const auto out = mrope_positions(ref.tensor("input.input_ids"), ref.tensor("input.attention_mask"),
                                   ref.tensor("input.image_grid_thw"), ref.tensor("input.video_grid_thw"),
                                   ref.tensor("input.second_per_grid_ts"), fixture_mrope_config());
  const auto want = ref.tensor("position_ids");
  ASSERT_EQ(out.positions.sizes(), want.sizes());
  EXPECT_TRUE(out.positions.equal(want)) << "first difference at flat index "
                                         << (out.positions != want).flatten().nonzero().min().item<int64_t>();
  EXPECT_TRUE(out.deltas.equal(ref.tensor("rope_deltas"))) << out.deltas << ref.tensor("rope_deltas");
  // What the fixture claims: left padding, a text-only row, non-integer video steps (2.7 per frame: ids 0 2
  // 5, truncated; rounding would give 0 3 5).
  const auto mask = ref.tensor("input.attention_mask");
  EXPECT_EQ(mask.select(1, 0).min().item<int64_t>(), 0);
  EXPECT_EQ(ref.tensor("input.second_per_grid_ts").item<float>(), 0.9f);
  EXPECT_EQ(ref.tensor("input.image_grid_thw").size(0), 2);
  EXPECT_EQ(ref.tensor("input.video_grid_thw")[0][0].item<int64_t>(), 3);
}

TEST(MRope, CosSinMatchTransformersRotaryEmbedding) {
  SafetensorsFile ref(mrope_dir() + "/reference.safetensors");
  const auto c = fixture_mrope_config();
  auto [cos, sin] = MRotaryEmbedding(c).cos_sin(ref.tensor("position_ids"), at::kFloat);
  ASSERT_EQ(cos.sizes(), ref.tensor("cos").sizes());
  const double ec = (cos - ref.tensor("cos")).abs().max().item<double>();
  const double es = (sin - ref.tensor("sin")).abs().max().item<double>();
  EXPECT_LT(ec, 1e-6);
  EXPECT_LT(es, 1e-6);
  std::cout << "M-RoPE: max cos diff " << ec << ", max sin diff " << es << "\n";
  // 2-D positions: the same id on all three axes, i.e. plain 1-D rotary.
  auto flat = at::arange(7, at::kLong).view({1, 7});
  auto [c1, s1] = MRotaryEmbedding(c).cos_sin(flat, at::kFloat);
  auto [c2, s2] = RotaryEmbedding(c.head_dim, c.rope_theta).cos_sin(flat, at::kFloat);
  EXPECT_LT((c1 - c2).abs().max().item<double>(), 1e-6);
  EXPECT_LT((s1 - s2).abs().max().item<double>(), 1e-6);
}

TEST(MRope, RejectsTokensThatDoNotFitTheGrids) {
  const auto c = fixture_mrope_config();
  const auto im = c.image_token_id;
  auto ids = at::tensor({int64_t{5}, im, im, im, int64_t{6}}, at::kLong).view({1, 5});
  auto grid = at::tensor({int64_t{1}, int64_t{4}, int64_t{4}}, at::kLong).view({1, 3});  // 4 tokens, not 3
  EXPECT_THROW(mrope_positions(ids, {}, grid, {}, {}, c), std::invalid_argument);
  auto two = at::tensor({int64_t{1}, int64_t{2}, int64_t{6}, int64_t{1}, int64_t{2}, int64_t{2}}, at::kLong)
                 .view({2, 3});
  EXPECT_THROW(mrope_positions(ids, {}, two, {}, {}, c), std::invalid_argument);  // a grid left over
  EXPECT_THROW(mrope_positions(ids, {}, {}, {}, {}, c), std::invalid_argument);   // no grid
}

ModelInputs full_inputs(const SafetensorsFile& ref) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.pixel_values = ref.tensor("input.pixel_values").clone();
  in.image_grid_thw = ref.tensor("input.image_grid_thw").clone();
  return in;
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  return (a - b).abs().masked_select(valid.unsqueeze(-1).expand_as(a)).max().item<double>();
}

// Qwen2_5_VLForConditionalGeneration as gmod's MultimodalLM (the vision encoder as its tower, no projector,
// the Qwen2 decoder with M-RoPE tables), loaded from save_pretrained's files: logits within 1e-5 on real
// tokens, loss within 1e-5, every parameter's gradient within 1e-4 relative (test_hf_parity.cpp's bounds),
// every parameter covered.
TEST(Qwen25VL, LogitsLossAndEveryGradientMatchTransformers) {
  auto model = load_pretrained(full_dir());
  ASSERT_TRUE(model->vision);
  EXPECT_FALSE(model->projector);
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  auto in = full_inputs(ref);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto g = hf_to_gmod(name.substr(5));
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "transformers parameter " << name.substr(5) << " has no gmod parameter";
      continue;
    }
    EXPECT_FALSE(covered[*g]) << *g << " covered twice";
    covered[*g] = true;
    const auto& grad = params[*g].grad();
    if (!grad.defined()) {
      ADD_FAILURE() << *g << " has no gradient in gmod";
      continue;
    }
    const auto r = ref.tensor(name);
    const double diff = (grad - r).norm().item<double>(),
                 rel = diff / std::max(r.norm().item<double>(), 1e-30);
    // 1e-8 floor as test_hf_parity.cpp: key biases have an exactly-zero true gradient (rounding noise both
    // sides).
    EXPECT_TRUE(rel < 1e-4 || diff < 1e-8) << "gradient of " << *g << ": relative L2 difference " << rel;
    if (diff >= 1e-8 && rel > worst) worst = rel, worst_name = *g;
    ++compared;
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_EQ(compared, load_json_file(full_dir() + "/reference.json").at("gradients").get<int>());
  std::cout << "Qwen2.5-VL: max logit diff " << logit_err << ", worst relative gradient diff " << worst
            << " (" << worst_name << ")\n";
}

// The trainer's label-only loss path (model/lm_loss.h) runs the same decoder part, M-RoPE included.
TEST(Qwen25VL, LabelOnlyLossPathMatchesTransformersLoss) {
  auto model = load_pretrained(full_dir());
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  ForwardState st;
  auto out = forward_label_loss(*model, full_inputs(ref), st, 8);
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
}

// gmod in bf16 is as close to the fp32 truth as transformers in bf16 (as test_hf_parity.cpp's bf16 case).
TEST(Qwen25VL, Bf16LogitsTrackTransformersBf16) {
  auto model = load_pretrained(full_dir(), at::kBFloat16);
  SafetensorsFile ref(full_dir() + "/reference.safetensors"),
      ref16(full_dir() + "/reference_bf16.safetensors");
  auto in = full_inputs(ref);
  in.pixel_values = in.pixel_values.to(at::kBFloat16);
  at::NoGradGuard ng;
  auto out = model->forward(in);
  const double ours = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  const double theirs = max_abs_on_valid(ref16.tensor("logits"), ref.tensor("logits"), in.attention_mask);
  EXPECT_LT(ours, 2.0 * theirs + 1e-3)
      << "gmod bf16 error " << ours << " vs transformers bf16 error " << theirs;
  std::cout << "Qwen2.5-VL bf16: max logit error gmod " << ours << ", transformers " << theirs << "\n";
}

// The batch exercises what it claims: left and right padding, a text-only row, several images, windows that
// cut.
TEST(Qwen25VL, FixtureCoversPaddingTextOnlyRowsAndCutWindows) {
  const auto c = load_model_config(full_dir());
  ASSERT_TRUE(c.qwen_vision && c.mrope);
  EXPECT_EQ(c.text.family, LlmFamily::kQwen2);
  EXPECT_TRUE(c.text.qkv_bias);
  EXPECT_LT(c.text.num_key_value_heads, c.text.num_attention_heads);
  EXPECT_EQ(c.text.mrope_section, (std::vector<int64_t>{2, 3, 3}));
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  const auto mask = ref.tensor("input.attention_mask"), ids = ref.tensor("input.input_ids");
  EXPECT_EQ(mask.select(1, 0).min().item<int64_t>(), 0) << "a left-padded row";
  EXPECT_EQ(mask.select(1, -1).min().item<int64_t>(), 0) << "a right-padded row";
  EXPECT_EQ((ids == c.image_token_id).sum(1).min().item<int64_t>(), 0) << "a text-only row";
  const auto layout = Qwen25VisionLayout::of(ref.tensor("input.image_grid_thw"), *c.qwen_vision);
  EXPECT_GT(layout.window_lengths.size(), layout.frame_lengths.size());
}

// Activation checkpointing as gmod train sets it (model.activation_checkpointing: full; the tower follows): the
// encoder blocks and the decoder layers recomputed in the backward. In fp32 on the CPU the loss, the logits and
// every parameter's gradient are bitwise those of the plain forward (model/unit_checkpoint.h).
TEST(Qwen25VL, FullActivationCheckpointingGivesBitwiseTheSameLossAndGradients) {
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  at::Tensor loss[2], logits[2];
  std::vector<std::pair<std::string, at::Tensor>> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    auto model = load_pretrained(full_dir());
    model->llm->activation_checkpointing = parse_activation_checkpointing(ck ? "full" : "none");
    model->vision->set_activation_checkpointing(ck == 1);
    auto out = model->forward(full_inputs(ref));
    out.lm_loss.backward();
    loss[ck] = out.lm_loss.detach(), logits[ck] = out.logits.detach();
    for (const auto& p : model->named_parameters()) grads[ck].emplace_back(p.key(), p.value().grad());
  }
  EXPECT_TRUE(loss[0].equal(loss[1])) << loss[0].item<double>() << " vs " << loss[1].item<double>();
  EXPECT_TRUE(logits[0].equal(logits[1]));
  ASSERT_EQ(grads[0].size(), grads[1].size());
  int vision = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    ASSERT_TRUE(grads[0][i].second.defined() && grads[1][i].second.defined()) << grads[0][i].first;
    EXPECT_TRUE(grads[0][i].second.equal(grads[1][i].second)) << "gradient of " << grads[0][i].first;
    vision += grads[0][i].first.rfind("vision.blocks.", 0) == 0;
  }
  EXPECT_GT(vision, 0) << "the encoder blocks' parameters are compared";
}

// Records which units run through the unit hooks (what ZeRO-3 gathers around, parallel/zero3_driver.h).
class RecordingHooks : public UnitHooks {
 public:
  void pre_forward(const torch::nn::Module& unit) override { order.push_back(&unit); }
  at::Tensor post_forward(const torch::nn::Module& unit, const at::Tensor& out) override {
    EXPECT_EQ(order.back(), &unit) << "a unit's forward nests another";
    return out;
  }
  std::vector<const torch::nn::Module*> order;
};

// ZeRO-3's units of Qwen2.5-VL: each encoder block, then the merger, then each decoder layer, and a forward runs
// exactly those, in that order, through the unit hooks (so the driver gathers every one before it runs).
TEST(Qwen25VL, ZeRO3UnitsAreTheEncoderBlocksTheMergerAndTheDecoderLayers) {
  auto model = load_pretrained(full_dir());
  const auto c = load_model_config(full_dir());
  std::map<const torch::nn::Module*, std::string> name_of;
  for (const auto& m : model->named_modules()) name_of[m.value().get()] = m.key();
  std::vector<std::string> names, expected;
  for (const auto& u : hooked_units(*model)) names.push_back(name_of.at(u.get()));
  for (int64_t i = 0; i < c.qwen_vision->depth; ++i) expected.push_back("vision.blocks." + std::to_string(i));
  expected.push_back("vision.merger");
  for (int64_t i = 0; i < c.text.num_hidden_layers; ++i) expected.push_back("llm.layers." + std::to_string(i));
  EXPECT_EQ(names, expected);

  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  for (const bool ck : {false, true}) {
    model->llm->activation_checkpointing = parse_activation_checkpointing(ck ? "full" : "none");
    model->vision->set_activation_checkpointing(ck);
    RecordingHooks hooks;
    set_unit_hooks(&hooks);
    auto out = model->forward(full_inputs(ref));
    set_unit_hooks(nullptr);
    std::vector<std::string> ran;
    for (const auto* u : hooks.order) ran.push_back(name_of.count(u) ? name_of.at(u) : "(not a module)");
    EXPECT_EQ(ran, expected) << "checkpointing " << ck;
  }
}

// `init: random` (MultimodalLM::init_weights) initialises every parameter as transformers' _init_weights does
// (tests/fixtures/make_qwen2_5_vl_init_fixture.py: a config whose vision initializer_range 0.5 differs from the
// text's 0.02): the same constants (norms 1, the merger's ln_q included; biases 0), and for the random ones the
// standard deviation within 25% (sample deviation of >= 512 draws: a few % apart) and the mean within 0.15 std.
TEST(Qwen25VL, RandomInitIsTransformers) {
  const auto dir = test::fixture("qwen2_5_vl/init");
  MultimodalLM model(load_model_config(dir));
  model.init_weights(1234);
  const auto ref = load_json_file(dir + "/init.json").at("parameters");
  auto params = model.named_parameters();
  size_t compared = 0;
  for (const auto& [hf, r] : ref.items()) {
    const auto g = hf_to_gmod(hf);
    ASSERT_TRUE(g && params.contains(*g)) << hf << " has no gmod parameter";
    const auto t = params[*g].detach().to(at::kDouble);
    ASSERT_EQ(t.numel(), r.at("numel").get<int64_t>()) << *g;
    const auto kind = r.at("kind").get<std::string>();
    if (kind == "ones") {
      EXPECT_TRUE(t.eq(1).all().item<bool>()) << *g << " must be all ones, as transformers initialises it";
    } else if (kind == "zeros") {
      EXPECT_TRUE(t.eq(0).all().item<bool>()) << *g << " must be all zeros";
    } else {
      const double std = r.at("std").get<double>();
      EXPECT_NEAR(t.std().item<double>(), std, 0.25 * std) << *g;
      EXPECT_NEAR(t.mean().item<double>(), r.at("mean").get<double>(), 0.15 * std) << *g;
    }
    ++compared;
  }
  EXPECT_EQ(compared, params.size()) << "every gmod parameter has transformers' initialisation";
}

// save_pretrained writes Qwen2_5_VLForConditionalGeneration's layout (visual.*, model.*, lm_head.*; text_config
// with rope_parameters.mrope_section, vision_config): the tensor names are exactly those transformers'
// save_pretrained wrote for the fixture, and the directory loads back to bitwise the same logits. (transformers loading it is
// tests/model/check_export_transformers.py, ctest export_transformers.)
TEST(Qwen25VL, SavePretrainedWritesTransformersNamesAndLoadsBack) {
  auto model = load_pretrained(full_dir());
  test::TempDir tmp;
  const auto dir = tmp.str("export");
  save_pretrained(*model, dir);
  std::set<std::string> ours, theirs;
  for (const auto& n : SafetensorsFile(dir + "/model.safetensors").names()) ours.insert(n);
  for (const auto& n : SafetensorsFile(full_dir() + "/model.safetensors").names()) theirs.insert(n);
  EXPECT_EQ(ours, theirs);
  const auto cfg = load_json_file(dir + "/config.json");
  EXPECT_EQ(cfg.at("architectures").at(0).get<std::string>(), "Qwen2_5_VLForConditionalGeneration");
  EXPECT_EQ(cfg.at("text_config").at("rope_parameters").at("mrope_section").get<std::vector<int64_t>>(),
            (std::vector<int64_t>{2, 3, 3}));
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  at::NoGradGuard ng;
  auto back = load_pretrained(dir);
  EXPECT_TRUE(back->forward(full_inputs(ref)).logits.equal(model->forward(full_inputs(ref)).logits));
}

}  // namespace

}  // namespace test_qwen2_5_vl

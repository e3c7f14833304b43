// A LLaVA model composed from its parts (LLM dir + CLIP dir + stage-1 projector) against
// LlavaForConditionalGeneration built by transformers from the same parts (tests/fixtures/make_parts_fixtures.py),
// the torch.save reader, and the one-error report for parts that do not fit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/anyres_grid.h"
#include "model/compose.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/torch_save.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"

using gmod::test::error_of;

using namespace gmod;

namespace {

ModelParts fixture_parts(const std::string& projector = "mm_projector.bin") {
  ModelParts p;
  p.llm = test::fixture("parts/llm");
  p.vision = test::fixture("parts/vision");
  p.projector = projector.empty() ? "" : test::fixture("parts/" + projector);
  return p;
}

TEST(Compose, LogitsMatchTransformersLlavaBuiltFromTheSameParts) {
  auto model = load_composed(fixture_parts());
  EXPECT_EQ(model->config.image_token_id, model->config.text.vocab_size);
  EXPECT_EQ(model->config.vision_feature_layer, -2);
  SafetensorsFile ref(test::fixture("parts/reference.safetensors"));
  ModelInputs in;
  in.input_ids = ref.tensor("input_ids").clone();
  in.attention_mask = ref.tensor("attention_mask").to(at::kBool);
  in.pixel_values = ref.tensor("pixel_values").clone();
  model->eval();
  at::NoGradGuard ng;
  const at::Tensor logits = model->forward(in).logits;
  const at::Tensor want = ref.tensor("logits");
  ASSERT_EQ(logits.sizes(), want.sizes());
  auto valid = in.attention_mask.unsqueeze(-1).expand_as(want);
  const double diff = (logits - want).abs().masked_select(valid).max().item<double>();
  EXPECT_LE(diff, 1e-5) << "max |gmod - transformers| over real tokens";
  EXPECT_GT(want.abs().max().item<double>(), 0.1);  // not a degenerate fixture
}

TEST(Compose, ProjectorSpellingsAndDtypesLoadTheSameTensors) {
  std::vector<std::string> problems;
  auto bin = read_projector(test::fixture("parts/mm_projector.bin"), problems);
  auto hf = read_projector(test::fixture("parts/projector_hf.safetensors"), problems);
  auto bf16 = read_projector(test::fixture("parts/mm_projector_bf16.bin"), problems);
  ASSERT_TRUE(problems.empty()) << problems.front();
  ASSERT_EQ(bin.size(), 4u);
  ASSERT_EQ(hf.size(), 4u);
  ASSERT_EQ(bf16.size(), 4u);
  std::map<std::string, at::Tensor> a(bin.begin(), bin.end()), b(hf.begin(), hf.end()), c(bf16.begin(), bf16.end());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(at::equal(t, b[name])) << name;
    EXPECT_EQ(c[name].scalar_type(), at::kBFloat16) << name;
    EXPECT_TRUE(at::equal(t.to(at::kBFloat16), c[name])) << name;
  }
  // The composed model really holds the file's projector, not a random one.
  auto model = load_composed(fixture_parts("projector_hf.safetensors"));
  EXPECT_TRUE(at::equal(model->projector->linear_1->weight, a["projector.linear_1.weight"]));
  EXPECT_TRUE(at::equal(model->projector->linear_2->bias, a["projector.linear_2.bias"]));
}

TEST(Compose, EveryPartIsLoadedBitExactly) {
  auto model = load_composed(fixture_parts());
  SafetensorsCheckpoint llm(test::fixture("parts/llm")), vision(test::fixture("parts/vision"));
  auto params = model->named_parameters(true);
  EXPECT_TRUE(at::equal(params["llm.layers.3.post_attention_layernorm.weight"],
                        llm.tensor("model.layers.3.post_attention_layernorm.weight")));
  EXPECT_TRUE(at::equal(params["lm_head.weight"], llm.tensor("lm_head.weight")));
  // transformers 5 writes a CLIPVisionModel without the "vision_model." prefix.
  EXPECT_TRUE(at::equal(params["vision.vision_model.encoder.layers.2.layer_norm1.bias"],
                        vision.tensor("encoder.layers.2.layer_norm1.bias")));
  EXPECT_TRUE(at::equal(params["vision.vision_model.pre_layrnorm.weight"], vision.tensor("pre_layrnorm.weight")));
}

// A CLIPModel directory (e.g. openai/clip-vit-large-patch14-336): nested vision_config, "vision_model."-prefixed
// tower tensors next to a text tower and projections that are skipped.
TEST(Compose, ClipModelDirectoryGivesTheSameTower) {
  test::TempDir tmp;
  std::filesystem::create_directories(tmp.str("clip"));
  nlohmann::json vc = nlohmann::json::parse(std::ifstream(test::fixture("parts/vision/config.json")));
  std::ofstream(tmp.str("clip/config.json")) << nlohmann::json{{"model_type", "clip"}, {"vision_config", vc},
                                                               {"text_config", {{"hidden_size", 8}}}}.dump();
  SafetensorsCheckpoint v(test::fixture("parts/vision"));
  std::vector<std::pair<std::string, at::Tensor>> t;
  for (const auto& n : v.names()) t.emplace_back("vision_model." + n, v.tensor(n));
  t.emplace_back("text_model.embeddings.token_embedding.weight", at::ones({4, 8}));
  t.emplace_back("visual_projection.weight", at::ones({8, 32}));
  t.emplace_back("logit_scale", at::ones({}));
  save_safetensors(tmp.str("clip/model.safetensors"), t);
  ModelParts p = fixture_parts();
  p.vision = tmp.str("clip");
  auto a = load_composed(p), b = load_composed(fixture_parts());
  auto pa = a->named_parameters(true), pb = b->named_parameters(true);
  for (const auto& item : pb) {
    if (item.key().rfind("vision.", 0) == 0) {
      EXPECT_TRUE(at::equal(item.value(), pa[item.key()])) << item.key();
    }
  }
}

TEST(Compose, WithoutProjectorFileTheProjectorIsInitialisedFromTheSeed) {
  auto a = load_composed(fixture_parts(""), at::kFloat, at::kCPU, 3);
  auto b = load_composed(fixture_parts(""), at::kFloat, at::kCPU, 3);
  auto c = load_composed(fixture_parts(""), at::kFloat, at::kCPU, 4);
  EXPECT_TRUE(at::equal(a->projector->linear_1->weight, b->projector->linear_1->weight));
  EXPECT_FALSE(at::equal(a->projector->linear_1->weight, c->projector->linear_1->weight));
  EXPECT_EQ(a->projector->linear_1->bias.abs().sum().item<double>(), 0.0);
}

TEST(Compose, PartsThatDoNotFitAreAllReportedInOneError) {
  test::TempDir tmp;
  // A vision dir whose preprocessor crops to another size than the tower's image_size.
  std::filesystem::create_directories(tmp.str("vision"));
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(test::fixture(std::string("parts/vision/") + f), tmp.str(std::string("vision/") + f));
  std::ofstream(tmp.str("vision/preprocessor_config.json")) << R"({"crop_size": {"height": 336, "width": 336}})";
  ModelParts p = fixture_parts("bad/mm_projector.bin");
  p.vision = tmp.str("vision");
  const std::string e = error_of([&] { load_composed(p); });
  EXPECT_NE(e.find("cannot compose the model from its parts"), std::string::npos) << e;
  EXPECT_NE(e.find("crops images to 336 px but the tower's image_size is 16"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown tensor 'model.mm_projector.3.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("'projector.linear_1.weight' has shape [64, 48]"), std::string::npos) << e;
  EXPECT_NE(e.find("bad/mm_projector.bin"), std::string::npos) << e;

  // A missing tensor is named; a combined LLaVA dir given as the LLM is refused; a text-only LLM composes.
  ModelParts q = fixture_parts("");
  q.projector = test::fixture("parts/bad/mm_projector.bin");
  EXPECT_NE(error_of([&] { load_composed(q); }).find("lacks projector.linear_2.bias"), std::string::npos);
  ModelParts r = fixture_parts();
  r.llm = test::fixture("hf/llava_layer_m2");
  EXPECT_NE(error_of([&] { compose_model_config(r); }).find("holds a multimodal (LLaVA) config"), std::string::npos);
  ModelParts text_only;
  text_only.llm = test::fixture("parts/llm");
  EXPECT_FALSE(load_composed(text_only)->vision);
  ModelParts s = fixture_parts();
  s.vision_feature_layer = -9;
  EXPECT_NE(error_of([&] { compose_model_config(s); }).find("vision_feature_layer -9 is out of range"),
            std::string::npos);
}

// LLaVA-NeXT from parts (model.image_grid_pinpoints): the same tower, projector and LLM, plus AnyRes with the
// original code's spatial_unpad and a random image_newline; an image of 16 x 36 px takes the 16 x 32 pinpoint's
// two tiles plus the base, and its LLM positions are anyres_image_tokens' count.
TEST(Compose, PinpointsComposeLlavaNextWithARandomNewline) {
  ModelParts p = fixture_parts();
  p.image_grid_pinpoints = {{16, 32}, {32, 16}, {32, 32}};
  auto next = load_composed(p, at::kFloat, at::kCPU, 5), plain = load_composed(fixture_parts());
  ASSERT_TRUE(next->config.anyres);
  EXPECT_TRUE(next->config.anyres->unpad_truncates);
  EXPECT_EQ(next->config.anyres->pinpoints, p.image_grid_pinpoints);
  ASSERT_TRUE(next->image_newline.defined());
  EXPECT_EQ(next->image_newline.sizes(), at::IntArrayRef({next->config.text.hidden_size}));
  EXPECT_GT(next->image_newline.abs().max().item<double>(), 0.0);
  EXPECT_TRUE(next->image_newline.equal(load_composed(p, at::kFloat, at::kCPU, 5)->image_newline));
  EXPECT_FALSE(next->image_newline.equal(load_composed(p, at::kFloat, at::kCPU, 6)->image_newline));
  auto a = next->named_parameters(), b = plain->named_parameters();
  EXPECT_EQ(a.size(), b.size() + 1);
  for (const auto& t : b) EXPECT_TRUE(a[t.key()].equal(t.value())) << t.key();

  const int tiles = anyres_num_tiles(16, 36, *next->config.anyres, 16);
  EXPECT_EQ(tiles, 3);
  const int64_t n = anyres_image_tokens(16, 36, *next->config.anyres, 16, 16 / 4);
  ModelInputs in;
  in.input_ids = at::full({1, n + 3}, int64_t(5), at::kLong);
  in.input_ids.narrow(1, 1, n).fill_(next->config.image_token_id);
  in.attention_mask = at::ones({1, n + 3}, at::kBool);
  in.pixel_values = at::randn({tiles, 3, 16, 16});
  in.image_sizes = at::tensor(std::vector<int64_t>{16, 36}, at::kLong).view({1, 2});
  next->eval();
  at::NoGradGuard ng;
  const auto logits = next->forward(in).logits;
  EXPECT_EQ(logits.sizes(), at::IntArrayRef({1, n + 3, next->config.text.vocab_size}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());

  ModelParts bad = fixture_parts();
  bad.image_grid_pinpoints = {{16, 30}};
  EXPECT_NE(error_of([&] { load_composed(bad); }).find("[16, 30] is not a whole grid of the tower's 16 px tiles"),
            std::string::npos);
}

TEST(TorchSave, ReadsNamedTensorsAndNamesTheFileOnBadInput) {
  auto t = read_torch_save(test::fixture("parts/mm_projector.bin"));
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].first, "model.mm_projector.0.weight");
  EXPECT_EQ(t[0].second.sizes(), at::IntArrayRef({64, 32}));
  test::TempDir tmp;
  std::ofstream(tmp.str("legacy.bin")) << "\x80\x02notazip";
  EXPECT_NE(error_of([&] { read_torch_save(tmp.str("legacy.bin")); }).find("legacy.bin: not a torch.save zip"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_torch_save(tmp.str("absent.bin")); }).find("absent.bin: cannot open"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_torch_save(test::fixture("parts/bad/tensor_only.bin")); })
                .find("single tensor, expected a dict"),
            std::string::npos);
}

}  // namespace

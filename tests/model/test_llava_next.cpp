// LLaVA-NeXT (AnyRes) against transformers' LlavaNextForConditionalGeneration on a committed fixture
// (tests/fixtures/make_llava_next_fixtures.py -> tests/fixtures/hf/llava_next_tiny): a batch with images of five
// aspect ratios (a pinpoint tie, a grid whose unpad extent needs transformers' rounding, rows and columns cut), a
// row with two images, a text-only row, right and left padding. Tolerances as test_hf_parity.cpp: logits 1e-5 max
// abs on real tokens, loss 1e-5, the gradient of every parameter 1e-4 relative (image_newline's included). The
// original LLaVA layout of the same weights (llava_llama, anyres, spatial_unpad, pinpoints as (width, height))
// loads to the same model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/anyres_grid.h"
#include "model/hf_names.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

const char* kCase = "hf/llava_next_tiny";

// The fixture's inputs, with transformers' [images, max tiles, 3, S, S] batch (zero tiles pad the shorter images)
// turned into gmod's [tiles, 3, S, S]: each image's own tiles, as many as its size gives.
ModelInputs inputs_from(const SafetensorsFile& ref, const LlavaConfig& c) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.image_sizes = ref.tensor("input.image_sizes").to(at::kLong);
  const auto pv = ref.tensor("input.pixel_values");
  std::vector<at::Tensor> tiles;
  for (int64_t i = 0; i < in.image_sizes.size(0); ++i) {
    const int h = in.image_sizes[i][0].item<int>(), w = in.image_sizes[i][1].item<int>();
    tiles.push_back(pv[i].narrow(0, 0, anyres_num_tiles(h, w, *c.anyres, c.vision->image_size)));
  }
  in.pixel_values = at::cat(tiles, 0).to(at::kFloat);
  return in;
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

}  // namespace

TEST(LlavaNext, LogitsLossAndEveryGradientMatchTransformers) {
  const auto dir = test::fixture(kCase);
  auto model = load_pretrained(dir);
  ASSERT_TRUE(model->config.anyres.has_value());
  ASSERT_TRUE(model->image_newline.defined());
  SafetensorsFile ref(dir + "/reference.safetensors");
  std::ifstream mf(dir + "/reference.json");
  ASSERT_TRUE(mf.good()) << dir << "/reference.json";
  const auto meta = nlohmann::json::parse(mf);
  auto in = inputs_from(ref, model->config);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  std::printf("[ info ] llava_next_tiny: %lld tiles of %lld images, max |logit diff| %.3g, loss %.7f vs %.7f\n",
              static_cast<long long>(in.pixel_values.size(0)), static_cast<long long>(in.image_sizes.size(0)),
              logit_err, out.lm_loss.item<double>(), ref.tensor("loss").item<double>());
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  auto cover = [&](const std::string& hf) -> std::string {
    const auto g = hf_to_gmod(hf);
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "transformers parameter " << hf << " has no gmod counterpart";
      return "";
    }
    EXPECT_FALSE(covered[*g]) << *g << " covered twice";
    covered[*g] = true;
    return *g;
  };
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto g = cover(name.substr(5));
    if (g.empty()) continue;
    const auto mine = params[g].grad();
    if (!mine.defined()) {
      ADD_FAILURE() << g << " has no gradient in gmod but has one in transformers";
      continue;
    }
    const auto r = ref.tensor(name);
    const double diff = (mine - r).norm().item<double>(), rel = diff / std::max(r.norm().item<double>(), 1e-30);
    EXPECT_TRUE(rel < 1e-4 || diff < 1e-8) << "gradient of " << g << ": relative L2 difference " << rel;
    if (rel > worst && diff >= 1e-8) worst = rel, worst_name = g;
    ++compared;
  }
  std::printf("[ info ] %d gradients compared, worst relative difference %.3g (%s)\n", compared, worst,
              worst_name.c_str());
  for (const auto& hf : meta.at("no_grad")) {
    const auto g = cover(hf.get<std::string>());
    if (g.empty()) continue;
    const auto mine = params[g].grad();
    EXPECT_TRUE(!mine.defined() || mine.abs().max().item<double>() == 0.0) << g << " should get no gradient";
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_TRUE(covered["image_newline"]);
  EXPECT_EQ(compared, meta.at("gradients").get<int>());
}

TEST(LlavaNext, FixtureHoldsTheCasesItClaims) {
  const auto c = load_model_config(test::fixture(kCase));
  ASSERT_TRUE(c.anyres.has_value());
  EXPECT_FALSE(c.anyres->unpad_truncates);  // transformers' rounding
  SafetensorsFile ref(test::fixture(kCase) + "/reference.safetensors");
  const auto sizes = ref.tensor("input.image_sizes");
  bool tie = false, parted = false;
  for (int64_t i = 0; i < sizes.size(0); ++i) {
    const int h = sizes[i][0].item<int>(), w = sizes[i][1].item<int>(), tile = c.vision->image_size;
    const auto& p = c.anyres->pinpoints;
    // a tie: reversing the candidates changes the choice
    std::vector<std::array<int, 2>> rev(p.rbegin(), p.rend());
    tie |= select_best_resolution(h, w, p) != select_best_resolution(h, w, rev);
    const auto g = anyres_grid_shape(h, w, *c.anyres, tile);
    const int side = tile / c.vision->patch_size;
    const auto a = anyres_unpad_box(h, w, g[0] * side, g[1] * side, false);
    const auto b = anyres_unpad_box(h, w, g[0] * side, g[1] * side, true);
    parted |= a.r1 - a.r0 != b.r1 - b.r0 || a.c1 - a.c0 != b.c1 - b.c0;
  }
  EXPECT_TRUE(tie) << "an image whose pinpoint is decided by the order";
  EXPECT_TRUE(parted) << "an image where transformers' and the original's unpad rounding part";
  // a text-only row and left padding
  const auto ids = ref.tensor("input.input_ids");
  const auto mask = ref.tensor("input.attention_mask");
  EXPECT_EQ(mask.select(1, 0).min().item<int64_t>(), 0);
  EXPECT_TRUE(((ids == c.image_token_id).sum(1) == 0).any().item<bool>());
}

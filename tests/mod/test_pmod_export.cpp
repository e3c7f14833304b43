// p-MoD written back in the original code's layout (mod/pmod_checkpoint.h: save_pmod_original), checked against what
// the original MCG-NJU/p-MoD code itself saved (tests/fixtures/pmod, made by tests/fixtures/make_pmod_fixtures.py from
// its PmodLlavaLlamaForCausalLM): the same tensor names with the same bytes, the config keys the original reads
// equal, and the written directory loads back in gmod to the same parameters. A schedule the original cannot express
// (its N = 31 hard-coded) is refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "mod/mod_checkpoint.h"
#include "mod/pmod.h"
#include "mod/pmod_checkpoint.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

nlohmann::json config_of(const std::string& dir) {
  std::ifstream f(dir + "/config.json");
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(PModExport, OriginalLayoutEqualsWhatTheOriginalCodeSaved) {
  const std::string dir = test::fixture("pmod/official31");
  auto model = load_pmod_original(dir, PModDenominator::kOfficial31);
  const auto mc = read_mod_config(dir);
  ASSERT_TRUE(mc);
  test::TempDir tmp;
  save_pmod_original(*model, *mc, tmp.str());

  SafetensorsCheckpoint theirs(dir), ours(tmp.str());
  ASSERT_EQ(ours.names(), theirs.names()) << "tensor names differ from the original's";
  for (const auto& n : theirs.names()) EXPECT_TRUE(at::equal(ours.tensor(n), theirs.tensor(n))) << n;

  const auto want = config_of(dir), got = config_of(tmp.str());
  for (const char* k : {"architectures", "model_type", "mod_target_layers", "mod_router_factor", "mod_weight_norm",
                        "mod_bias_enabled", "mod_special_init", "mod_target_token_type", "mod_target_layer_indices",
                        "mm_vision_tower", "mm_hidden_size", "mm_projector_type", "mm_vision_select_layer",
                        "mm_vision_select_feature", "mm_patch_merge_type", "mm_use_im_start_end",
                        "mm_use_im_patch_token", "image_aspect_ratio", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
                        "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings"})
    EXPECT_EQ(got.value(k, nlohmann::json()), want.value(k, nlohmann::json())) << "config key " << k;
  const auto clip_want = config_of(dir + "/clip"), clip_got = config_of(tmp.str() + "/clip");
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                        "patch_size", "hidden_act", "layer_norm_eps"})
    EXPECT_EQ(clip_got.value(k, nlohmann::json()), clip_want.value(k, nlohmann::json())) << "clip config key " << k;

  // And back: the written directory is an original p-MoD directory gmod reads to the same parameters.
  auto back = load_pmod_original(tmp.str(), PModDenominator::kOfficial31);
  auto a = model->named_parameters(true), b = back->named_parameters(true);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) EXPECT_TRUE(at::equal(p.value(), b[p.key()])) << p.key();
}

TEST(PModExport, AScheduleTheOriginalCannotExpressIsRefused) {
  // The "depth" fixture's schedule divides by num_layers - 1 = 3; the original code always divides by 31.
  const std::string dir = test::fixture("pmod/depth");
  auto model = load_pmod_original(dir, PModDenominator::kDepth);
  MoDConfig mc = pmod_config(model->config.text.num_hidden_layers, PModDenominator::kDepth);
  test::TempDir tmp;
  try {
    save_pmod_original(*model, mc, tmp.str() + "/out");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("hard-codes 31"), std::string::npos) << m;
    EXPECT_NE(m.find("num_layers - 1 = 3"), std::string::npos) << m;
  }
}

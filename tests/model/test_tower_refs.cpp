// Published directories load unedited (model/tower_refs.h): original LLaVA-HR / LLaVA-1.5 / γ-MoD configs
// name their towers (a hub id or a path) instead of embedding their configs. A LLaVA-HR fixture saved as the
// original code saves it (towers named by path) loads and computes what the embedded-config copy computes,
// bitwise; the CLIP reference resolves through the override, the model directory, absolute paths, the Hugging
// Face cache and the known architectures, in that order; a failure lists every place looked. Also: token ids
// outside the vocabulary are a named error (tests/mod/test_gamma_mod_config.cpp: γ-MoD's own config).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/config.h"
#include "model/llava_hr_config.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/tower_refs.h"
#include "tests/common/paths.h"
#include "tests/model/fixture_dir_edit.h"
#include "tests/model/tower_parity.h"

using namespace gmod;
namespace fs = std::filesystem;

namespace {

nlohmann::json fixture_config(const std::string& name) {
  nlohmann::json j;
  std::ifstream(test::fixture(name) + "/config.json") >> j;
  return j;
}

// Sets an environment variable for the scope, restoring the previous value.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const std::string& v) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    setenv(n, v.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old)
      setenv(name.c_str(), old->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

// LLaVA-HR's config as its code saves it: the CLIP and the ConvNeXt named, neither embedded.
void as_published(nlohmann::json& j, const std::string& clip, const std::string& convnext) {
  j["mm_vision_tower"] = clip;
  j["vision_tower_slow"] = convnext;
  j.erase("vision_config");
  j.erase("vision_config_slow");
}

void write_config(const std::string& dir, const nlohmann::json& j) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump();
}

// The published copy computes, on fixture `name`'s reference batch, exactly the logits of the fixture itself.
void expect_same_logits(MultimodalLM& published, const std::string& name, const std::string& generator) {
  auto embedded = load_pretrained(test::fixture(name));
  SafetensorsFile ref(test::fixture(name + "/reference.safetensors"));
  const auto meta = test::read_fixture_json(test::fixture(name + "/reference.json"), generator);
  ModelInputs in = test::tower_fixture_inputs(ref, meta.at("pixel_repeat").get<int>());
  at::NoGradGuard ng;
  published.eval(), embedded->eval();
  ForwardState s1, s2;
  EXPECT_TRUE(published.forward(in, s1).logits.equal(embedded->forward(in, s2).logits)) << name;
}

}  // namespace

TEST(TowerRefs, PublishedLlavaHrDirectoryLoadsUneditedAndComputesTheSame) {
  test::TempDir tmp;
  const std::string clip = fs::absolute(test::fixture("llava_hr/parts/clip")).string();
  const std::string convnext = fs::absolute(test::fixture("llava_hr/parts/convnext")).string();
  const auto dir = test::copy_fixture_dir(
      tmp, "llava_hr/hr384_frozen", "published", [](const std::string&) { return true; },
      [&](nlohmann::json& j) { as_published(j, clip, convnext); });
  auto published = load_pretrained(dir);
  const auto embedded_config = load_model_config(test::fixture("llava_hr/hr384_frozen"));
  ASSERT_TRUE(published->config.multipath);
  EXPECT_EQ(published->config.vision->num_hidden_layers, embedded_config.vision->num_hidden_layers);
  EXPECT_EQ(published->config.multipath->slow.dims, embedded_config.multipath->slow.dims);
  expect_same_logits(*published, "llava_hr/hr384_frozen", "make_llava_hr_fixtures.py");
}

// Mini-Gemini as its code saves it: the CLIP named by a path relative to the model directory (the ConvNeXt is
// named by its directory, as before): loads and computes what the embedded-config fixture computes, bitwise.
TEST(TowerRefs, PublishedMgmDirectoryLoadsUneditedAndComputesTheSame) {
  test::TempDir tmp;
  const auto dir = test::copy_fixture_dir(
      tmp, "mgm/base_frozen", "published", [](const std::string&) { return true; },
      [&](nlohmann::json& j) {
        j["mm_vision_tower"] = "towers/clip-vit";
        j.erase("vision_config");
      });
  nlohmann::json clip;
  std::ifstream(test::fixture("mgm/parts/clip/config.json")) >> clip;
  write_config(dir + "/towers/clip-vit", clip);
  auto published = load_pretrained(dir);
  ASSERT_TRUE(published->config.mgm);
  expect_same_logits(*published, "mgm/base_frozen", "make_mgm_fixtures.py");
}

TEST(TowerRefs, ClipReferenceResolvesInTheStatedOrder) {
  test::TempDir tmp;
  auto j = fixture_config("llava_hr/hr384_frozen");
  const std::string clip4 = test::fixture("llava_hr/parts/clip");
  nlohmann::json clip_cfg;
  std::ifstream(clip4 + "/config.json") >> clip_cfg;
  auto layers_of = [](const nlohmann::json& cfg) {
    return cfg["vision_config"]["num_hidden_layers"].get<int>();
  };
  // Three CLIP configs that differ only in depth, at the places the lookup visits.
  auto clip_with = [&](const std::string& dir, int layers) {
    auto c = clip_cfg;
    c["num_hidden_layers"] = layers;
    write_config(dir, c);
  };
  const std::string model_dir = tmp.str("model");
  clip_with(model_dir + "/towers/clip", 8);                           // relative to the model
  clip_with(tmp.str("abs-clip"), 12);                                 // absolute
  clip_with(tmp.str("hub/models--tiny--clip/snapshots/abc123"), 16);  // the Hugging Face cache
  fs::create_directories(tmp.str("hub/models--tiny--clip/refs"));
  std::ofstream(tmp.str("hub/models--tiny--clip/refs/main")) << "abc123\n";
  clip_with(tmp.str("override"), 20);
  ScopedEnv cache("HF_HUB_CACHE", tmp.str("hub"));

  auto resolved = [&](const std::string& ref, const TowerOverrides& o = {}) {
    auto c = j;
    c.erase("vision_config");
    c["mm_vision_tower"] = ref;
    resolve_tower_refs(c, model_dir, "config.json", o);
    return c;
  };
  EXPECT_EQ(layers_of(resolved("towers/clip")), 8);
  EXPECT_EQ(layers_of(resolved(tmp.str("abs-clip"))), 12);
  EXPECT_EQ(layers_of(resolved("tiny/clip")), 16);
  EXPECT_EQ(layers_of(resolved("tiny/clip", TowerOverrides{tmp.str("override"), "", ""})), 20);
  // The override also wins over an embedded config; without one, the embedded config is kept.
  auto embedded = j;
  resolve_tower_refs(embedded, model_dir, "config.json", TowerOverrides{tmp.str("override"), "", ""});
  EXPECT_EQ(layers_of(embedded), 20);
  auto kept = j;
  resolve_tower_refs(kept, model_dir, "config.json", {});
  EXPECT_EQ(kept["vision_config"], j["vision_config"]);
  // The known architectures: OpenAI's CLIP ViT-L/14-336 without any directory (an empty cache).
  ScopedEnv empty("HF_HUB_CACHE", tmp.str("no-cache"));
  const auto known = resolved("openai/clip-vit-large-patch14-336")["vision_config"];
  EXPECT_EQ(known["hidden_size"], 1024);
  EXPECT_EQ(known["num_hidden_layers"], 24);
  EXPECT_EQ(known["image_size"], 336);
  EXPECT_EQ(known["patch_size"], 14);
  // A reference found nowhere: every place looked is named.
  try {
    resolved("nobody/unknown-tower");
    FAIL() << "an unknown tower resolved";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    for (const char* part : {"nobody/unknown-tower", "relative to the model", "models--nobody--unknown-tower",
                             "known architectures", "openai/clip-vit-large-patch14-336", "--vision-tower"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
}

TEST(TowerRefs, ConvNextNamedByPathResolvesByItsTimmConfigOrItsName) {
  auto j = fixture_config("llava_hr/hr384_frozen");
  // A path whose last component is the timm name (the directory need not exist).
  auto by_name = j;
  by_name.erase("vision_config_slow");
  by_name["vision_tower_slow"] = "/models/timm/convnext_large_mlp.clip_laion2b_ft_320";
  resolve_tower_refs(by_name, "", "config.json", {});
  EXPECT_EQ(by_name["vision_config_slow"], convnext_shape_to_json(*convnext_preset("convnext_large_mlp")));
  // A timm directory: its architecture, with its model_args over the architecture's shape.
  auto by_dir = j;
  by_dir.erase("vision_config_slow");
  by_dir["vision_tower_slow"] = fs::absolute(test::fixture("llava_hr/parts/convnext")).string();
  resolve_tower_refs(by_dir, "", "config.json", {});
  EXPECT_EQ(by_dir["vision_config_slow"]["dims"], nlohmann::json({8, 16, 24, 32}));
  // An unknown name stays unresolved: parse_llava_hr_fields names it.
  auto unknown = j;
  unknown.erase("vision_config_slow");
  unknown["vision_tower_slow"] = "/models/resnet50";
  resolve_tower_refs(unknown, "", "config.json", {});
  EXPECT_FALSE(unknown.contains("vision_config_slow"));
}

TEST(TokenIds, OutsideTheVocabularyIsANamedError) {
  auto model = load_pretrained(test::fixture("hf/llava_layer_m2"));
  const int64_t V = model->config.text.vocab_size;
  ModelInputs in;
  in.input_ids = at::randint(0, V, {2, 8}, at::kLong);
  in.input_ids[1][5] = -200;  // LLaVA's image marker given as a token
  in.input_ids[0][3] = V;
  ForwardState st;
  try {
    model->forward(in, st);
    FAIL() << "out-of-range ids were embedded";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 token id(s) outside the vocabulary [0, " + std::to_string(V) + ")"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("the first " + std::to_string(V) + " at sample 0, position 3"), std::string::npos) << m;
  }
}

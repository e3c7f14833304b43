// γ-MoD checkpoints in Hugging Face layout: save_mod_pretrained -> load_mod_pretrained keeps logits and
// routing bit-identical (shared γ router and per-layer routers), unequal γ router copies are a clear
// error, the official `model.layers.{i}.router.weight` names load, and a dense export is a plain checkpoint.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hf_names.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;
using namespace gmod::test;

namespace {

struct Run {
  at::Tensor logits;
  std::vector<LayerTokens> tokens;
};

Run run(MultimodalLM& m, const ModelInputs& in, bool training) {
  at::NoGradGuard ng;
  m.train(training);
  ForwardState st;
  auto out = m.forward(in, st);
  return {out.logits, st.tokens};
}

void expect_same(const Run& a, const Run& b, const std::string& what) {
  EXPECT_TRUE(at::equal(a.logits, b.logits)) << what;
  ASSERT_EQ(a.tokens.size(), b.tokens.size()) << what;
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    EXPECT_EQ(a.tokens[i].layer, b.tokens[i].layer) << what;
    EXPECT_EQ(a.tokens[i].processed, b.tokens[i].processed) << what << " layer " << a.tokens[i].layer;
    EXPECT_EQ(a.tokens[i].total, b.tokens[i].total) << what;
    EXPECT_EQ(a.tokens[i].attn_pairs, b.tokens[i].attn_pairs) << what;
  }
}

std::shared_ptr<MultimodalLM> converted(const MoDConfig& c) {
  auto m = load_pretrained(llava_fixture());
  convert_to_mod(*m, c);
  return m;
}

MoDConfig cfg_for(RouterKind k, std::vector<int> layers) {
  MoDConfig c;
  c.router = k;
  c.mod_layers = std::move(layers);
  c.router_init_seed = 7;
  c.infer_threshold = 0.5;  // so that inference routing skips tokens too
  c.selection = "test";
  return c;
}

nlohmann::json read_json(const std::string& p) { return nlohmann::json::parse(std::ifstream(p)); }

// Rewrites every tensor of dir/model.safetensors through `f(name, tensor) -> (name, tensor)`; "" drops it.
template <class F>
void rewrite(const std::string& dir, F f) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  {
    SafetensorsFile file(dir + "/model.safetensors");
    for (const auto& n : file.names()) {
      auto nt = f(n, file.tensor(n).clone());
      if (!nt.first.empty()) out.push_back(nt);
    }
  }
  save_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
}

}  // namespace

TEST(HfNames, RouterNamesInEveryLayout) {
  EXPECT_EQ(hf_router_layer("language_model.model.layers.3.router.weight"), 3);
  EXPECT_EQ(hf_router_layer("model.layers.12.router.weight"), 12);
  EXPECT_EQ(hf_router_layer("model.language_model.layers.0.router.weight"), 0);
  EXPECT_FALSE(hf_router_layer("model.layers.3.mlp.up_proj.weight").has_value());
  EXPECT_FALSE(hf_router_layer("model.layers.x.router.weight").has_value());
  EXPECT_EQ(hf_router_name(5, HfLayout::kLlava), "language_model.model.layers.5.router.weight");
  EXPECT_EQ(hf_router_name(5, HfLayout::kLlama), "model.layers.5.router.weight");
}

TEST(ModCheckpoint, RoundTripKeepsLogitsAndRouting) {
  const auto in = fixture_inputs();
  for (auto kind : {RouterKind::kGammaShared, RouterKind::kPerLayer, RouterKind::kAttention}) {
    const std::string name = to_string(kind);
    const auto c = cfg_for(kind, kind == RouterKind::kAttention ? std::vector<int>{1} : std::vector<int>{0, 1});
    auto m = converted(c);
    TempDir tmp;
    save_mod_pretrained(*m, c, tmp.str("out"));
    const auto cfg = read_json(tmp.str("out/config.json"));
    ASSERT_TRUE(cfg.contains("mod")) << name;
    EXPECT_EQ(cfg["mod"]["mod_enable"], true);
    EXPECT_EQ(cfg["mod"]["mod_layers_idx"], nlohmann::json(c.mod_layers));
    EXPECT_EQ(cfg["mod"]["router"], name);
    SafetensorsFile f(tmp.str("out/model.safetensors"));
    for (int l : c.mod_layers)
      EXPECT_EQ(f.has("language_model.model.layers." + std::to_string(l) + ".router.weight"),
                kind != RouterKind::kAttention)
          << name;
    EXPECT_FALSE(f.has("mod_router.weight"));

    auto back = load_mod_pretrained(tmp.str("out"));
    EXPECT_EQ(mod_layers(*back).size(), c.mod_layers.size()) << name;
    EXPECT_EQ(shared_router(*back) != nullptr, kind == RouterKind::kGammaShared) << name;
    for (bool training : {true, false}) {
      const auto a = run(*m, in, training), b = run(*back, in, training);
      expect_same(a, b, name + (training ? " top-k" : " thresholds"));
      bool skipped = false;
      for (auto& t : a.tokens) skipped |= t.processed < t.total;
      if (training) {
        EXPECT_TRUE(skipped) << name << ": the test should exercise routing";
      }
    }
  }
}

TEST(ModCheckpoint, UnequalGammaRouterCopiesAreAClearErrorAMissingOneIsNot) {
  const auto c = cfg_for(RouterKind::kGammaShared, {0, 1});
  auto m = converted(c);
  TempDir tmp;
  save_mod_pretrained(*m, c, tmp.str());
  const std::string bad = "language_model.model.layers.1.router.weight";
  rewrite(tmp.str(), [&](const std::string& n, at::Tensor t) {
    if (n == bad) t.add_(1e-3);
    return std::make_pair(n, t);
  });
  try {
    load_mod_pretrained(tmp.str());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("language_model.model.layers.0.router.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("differ"), std::string::npos) << msg;
  }
  // A missing copy is not an error (transformers' safetensors save drops a shared tensor's aliases): the copy
  // left is the router.
  rewrite(tmp.str(), [&](const std::string& n, at::Tensor t) { return std::make_pair(n == bad ? "" : n, t); });
  const auto loaded = load_mod_pretrained(tmp.str());
  EXPECT_TRUE(at::equal(shared_router(*loaded)->weight, shared_router(*m)->weight));
  // No copy at all is an error naming the copies it looked for, in the file's layout.
  const std::string first = "language_model.model.layers.0.router.weight";
  rewrite(tmp.str(), [&](const std::string& n, at::Tensor t) { return std::make_pair(n == first ? "" : n, t); });
  try {
    load_mod_pretrained(tmp.str());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(first), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no copy of the shared router"), std::string::npos) << e.what();
  }
}

TEST(ModCheckpoint, OfficialRouterNamesLoadIntoTheSharedRouter) {
  const auto in = fixture_inputs();
  const auto c = cfg_for(RouterKind::kGammaShared, {1});
  auto m = converted(c);
  TempDir tmp;
  save_mod_pretrained(*m, c, tmp.str());
  rewrite(tmp.str(), [](const std::string& n, at::Tensor t) {
    if (auto l = hf_router_layer(n)) return std::make_pair("model.layers." + std::to_string(*l) + ".router.weight", t);
    return std::make_pair(n, t);
  });
  auto back = load_mod_pretrained(tmp.str());
  expect_same(run(*m, in, true), run(*back, in, true), "official names");
}

TEST(ModCheckpoint, DenseExportIsAPlainCheckpoint) {
  const auto in = fixture_inputs();
  auto m = load_pretrained(llava_fixture());
  TempDir tmp;
  save_mod_pretrained(*m, MoDConfig{}, tmp.str());
  EXPECT_FALSE(read_json(tmp.str("config.json")).contains("mod"));
  EXPECT_FALSE(read_mod_config(tmp.str()).has_value());
  EXPECT_TRUE(at::equal(run(*load_pretrained(tmp.str()), in, false).logits, run(*m, in, false).logits));
  EXPECT_TRUE(at::equal(run(*load_mod_pretrained(tmp.str()), in, false).logits, run(*m, in, false).logits));
  // A converted model with a config that does not match it is refused.
  auto mm = converted(cfg_for(RouterKind::kGammaShared, {1}));
  EXPECT_THROW(save_mod_pretrained(*mm, MoDConfig{}, tmp.str("x")), std::invalid_argument);
}

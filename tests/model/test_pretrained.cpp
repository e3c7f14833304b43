// Loading checkpoints: every key layout, partial (projector-only) loads, round trips through
// save_pretrained, and a clear error for each kind of bad config or checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"

using gmod::test::error_of;

using namespace gmod;

namespace {

const std::string kLlava = "hf/llava_layer_m2";
const std::string kLlama = "hf/llama_untied_gqa";

ModelInputs reference_inputs(const std::string& dir) {
  SafetensorsFile ref(dir + "/reference.safetensors");
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  if (ref.has("input.pixel_values")) in.pixel_values = ref.tensor("input.pixel_values").clone();
  return in;
}

// Rewrites a checkpoint's tensor names with `rename` (nullopt = drop) into dir/model.safetensors.
void rewrite(const std::string& src, const std::string& dst_dir,
             const std::function<std::optional<std::string>(const std::string&)>& rename,
             const std::function<at::Tensor(const std::string&, at::Tensor)>& edit = nullptr) {
  SafetensorsCheckpoint ck(src);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& n : ck.names()) {
    auto r = rename(n);
    if (!r) continue;
    auto t = ck.tensor(n).clone();
    if (edit) t = edit(n, t);
    out.emplace_back(*r, t);
  }
  std::filesystem::create_directories(dst_dir);
  save_safetensors(dst_dir + "/model.safetensors", out);
  std::filesystem::copy_file(src + "/config.json", dst_dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
}

at::Tensor logits_of(MultimodalLM& m, const ModelInputs& in) {
  at::NoGradGuard ng;
  return m.forward(in).logits;
}

TEST(Pretrained, OriginalLlavaAndNewTransformersPrefixesLoadToTheSameModel) {
  const auto src = test::fixture(kLlava);
  auto ref = load_pretrained(src);
  auto in = reference_inputs(src);
  auto expected = logits_of(*ref, in);
  test::TempDir tmp;
  // transformers >= 4.52 in-memory names.
  rewrite(src, tmp.str("new"), [](const std::string& n) -> std::optional<std::string> {
    if (n.rfind("language_model.model.", 0) == 0) return "model.language_model." + n.substr(21);
    if (n.rfind("language_model.lm_head.", 0) == 0) return "lm_head." + n.substr(23);
    if (n.rfind("vision_tower.", 0) == 0) return "model.vision_tower.vision_model." + n.substr(13);
    if (n.rfind("multi_modal_projector.", 0) == 0) return "model." + n;
    return n;
  });
  EXPECT_TRUE(at::equal(logits_of(*load_pretrained(tmp.str("new")), in), expected));
  // Original LLaVA: model.*, model.mm_projector.{0,2}, tower under model.vision_tower.vision_tower.
  rewrite(src, tmp.str("orig"), [](const std::string& n) -> std::optional<std::string> {
    if (n.rfind("language_model.model.", 0) == 0) return "model." + n.substr(21);
    if (n.rfind("language_model.lm_head.", 0) == 0) return "lm_head." + n.substr(23);
    if (n.rfind("vision_tower.", 0) == 0) return "model.vision_tower.vision_tower.vision_model." + n.substr(13);
    if (n.rfind("multi_modal_projector.linear_1.", 0) == 0) return "model.mm_projector.0." + n.substr(31);
    if (n.rfind("multi_modal_projector.linear_2.", 0) == 0) return "model.mm_projector.2." + n.substr(31);
    return n;
  });
  EXPECT_TRUE(at::equal(logits_of(*load_pretrained(tmp.str("orig")), in), expected));
}

TEST(Pretrained, ProjectorOnlyFileLoadsOverAnLlmCheckpoint) {
  const auto src = test::fixture(kLlava);
  auto ref = load_pretrained(src);
  test::TempDir tmp;
  // Stage-1 output: only the projector, with different values.
  rewrite(
      src, tmp.str("proj"),
      [](const std::string& n) -> std::optional<std::string> {
        if (n.rfind("multi_modal_projector.", 0) == 0) return n;
        return std::nullopt;
      },
      [](const std::string&, at::Tensor t) { return t + 1.0; });
  auto m = load_pretrained(src);
  auto report = load_weights(*m, tmp.str("proj/model.safetensors"), LoadOptions{{}, /*partial=*/true, {}, {}});
  EXPECT_EQ(report.loaded.size(), 4u);
  auto params = m->named_parameters();
  auto refp = ref->named_parameters();
  EXPECT_TRUE(at::equal(params["projector.linear_1.weight"], refp["projector.linear_1.weight"] + 1.0));
  EXPECT_TRUE(at::equal(params["llm.norm.weight"], refp["llm.norm.weight"]));
  // Without `partial`, the same file is an incomplete checkpoint.
  auto m2 = load_pretrained(src);
  auto err = error_of([&] { load_weights(*m2, tmp.str("proj/model.safetensors")); });
  EXPECT_NE(err.find("lacks tensors"), std::string::npos) << err;
  EXPECT_NE(err.find("llm.embed_tokens.weight"), std::string::npos) << err;
}

TEST(Pretrained, SavePretrainedRoundTripsBothLayouts) {
  for (const auto& name : {kLlava, kLlama, std::string("hf/llama_tied")}) {
    const auto src = test::fixture(name);
    auto m = load_pretrained(src);
    auto in = reference_inputs(src);
    test::TempDir tmp;
    save_pretrained(*m, tmp.str("out"));
    auto back = load_pretrained(tmp.str("out"));
    EXPECT_TRUE(at::equal(logits_of(*back, in), logits_of(*m, in))) << name;
    // Sharded writing reads back the same.
    save_pretrained(*m, tmp.str("sharded"), {}, "{}", /*max_shard_bytes=*/64 * 1024);
    EXPECT_TRUE(std::filesystem::exists(tmp.str("sharded/model.safetensors.index.json"))) << name;
    EXPECT_TRUE(at::equal(logits_of(*load_pretrained(tmp.str("sharded")), in), logits_of(*m, in))) << name;
  }
}

TEST(Pretrained, ShapeThatContradictsTheConfigNamesTensorAndFile) {
  const auto src = test::fixture(kLlama);
  test::TempDir tmp;
  rewrite(
      src, tmp.str("bad"), [](const std::string& n) -> std::optional<std::string> { return n; },
      [](const std::string& n, at::Tensor t) {
        return n == "model.layers.1.mlp.up_proj.weight" ? t.narrow(0, 0, 64).clone() : t;
      });
  auto err = error_of([&] { load_pretrained(tmp.str("bad")); });
  EXPECT_NE(err.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST(Pretrained, MissingAndUnknownTensorsAreReported) {
  const auto src = test::fixture(kLlama);
  test::TempDir tmp;
  rewrite(src, tmp.str("missing"), [](const std::string& n) -> std::optional<std::string> {
    if (n == "model.norm.weight") return std::nullopt;
    return n;
  });
  auto err = error_of([&] { load_pretrained(tmp.str("missing")); });
  EXPECT_NE(err.find("llm.norm.weight"), std::string::npos) << err;
  rewrite(src, tmp.str("unknown"), [](const std::string& n) -> std::optional<std::string> {
    if (n == "model.norm.weight") return "model.final_norm.weight";
    return n;
  });
  err = error_of([&] { load_pretrained(tmp.str("unknown")); });
  EXPECT_NE(err.find("model.final_norm.weight"), std::string::npos) << err;
}

TEST(ModelConfig, ReportsEveryMissingFieldAtOnceWithTheFileName) {
  test::TempDir tmp;
  nlohmann::json j = {{"hidden_size", 64}, {"num_attention_heads", 4}};
  std::ofstream(tmp.str("config.json")) << j.dump();
  auto err = error_of([&] { load_model_config(tmp.str()); });
  EXPECT_NE(err.find(tmp.str("config.json")), std::string::npos) << err;
  for (auto f : {"vocab_size", "intermediate_size", "num_hidden_layers"})
    EXPECT_NE(err.find(std::string("missing field '") + f + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("3 problems"), std::string::npos) << err;
}

TEST(ModelConfig, RejectsInconsistentValuesAndMalformedJson) {
  test::TempDir tmp;
  nlohmann::json j = {{"vocab_size", 10},        {"hidden_size", 64}, {"intermediate_size", 8},
                      {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 3},
                      {"rope_scaling", {{"rope_type", "yarn"}}}};
  std::ofstream(tmp.str("config.json")) << j.dump();
  auto err = error_of([&] { load_model_config(tmp.str()); });
  EXPECT_NE(err.find("not a multiple of num_key_value_heads"), std::string::npos) << err;
  EXPECT_NE(err.find("yarn"), std::string::npos) << err;
  std::ofstream(tmp.str("bad.json")) << "{\"vocab_size\": 10,";
  err = error_of([&] { load_model_config(tmp.str("bad.json")); });
  EXPECT_NE(err.find("malformed JSON"), std::string::npos) << err;
  err = error_of([&] { load_model_config(tmp.str("nope.json")); });
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

// The explicit-mask path (a left-padded row: the key mask is materialised) gives the logits of the fused
// causal fast path (no mask) on the same tokens, when the padded row carries the unpadded row's positions;
// and the mask matters: the same padded row without it lets the pad keys in.
TEST(MultimodalLM, LeftPaddedExplicitMaskPathEqualsUnpaddedFastPath) {
  const auto src = test::fixture(kLlava);
  auto m = load_pretrained(src);
  auto in = reference_inputs(src);
  const int64_t n =
      in.attention_mask[0].sum().item<int64_t>();  // sample 0's real tokens (a right-padded row)
  const int64_t pad = 5;
  ModelInputs fast;
  fast.input_ids = in.input_ids.narrow(0, 0, 1).narrow(1, 0, n).clone();
  fast.pixel_values = in.pixel_values.narrow(0, 0, 1);
  ModelInputs left = fast;
  left.input_ids = at::cat({at::full({1, pad}, 7, at::kLong), fast.input_ids}, 1);
  left.attention_mask = at::cat({at::zeros({1, pad}, at::kBool), at::ones({1, n}, at::kBool)}, 1);
  left.positions = (at::arange(n + pad, at::kLong) - pad).clamp_min(0).unsqueeze(0);
  at::NoGradGuard ng;
  ForwardState st_fast, st_left;
  auto a = m->forward(fast, st_fast).logits;
  auto b = m->forward(left, st_left).logits.narrow(1, pad, n);
  EXPECT_FALSE(st_fast.mask.allowed.defined()) << "unpadded input should take the fused causal path";
  ASSERT_TRUE(st_left.mask.allowed.defined()) << "left padding should take the explicit-mask path";
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-5);
  ModelInputs leak = left;
  leak.attention_mask = at::Tensor();
  auto c = logits_of(*m, leak).narrow(1, pad, n);
  EXPECT_GT((a - c).abs().max().item<double>(), 1e-3) << "pad keys should change the logits when not masked";
}

TEST(MultimodalLM, ImageTokenCountMismatchIsAClearError) {
  const auto src = test::fixture(kLlava);
  auto m = load_pretrained(src);
  auto in = reference_inputs(src);
  in.pixel_values = in.pixel_values.narrow(0, 0, 2);  // three images' tokens, two images
  auto err = error_of([&] { m->forward(in); });
  EXPECT_NE(err.find("image-token positions"), std::string::npos) << err;
}

}  // namespace

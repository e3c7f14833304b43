// Qwen3-VL against transformers on committed fixtures (tests/fixtures/make_qwen3_vl_fixtures.py, transformers
// 5.24.0's Qwen3VLForConditionalGeneration at tiny random weights), loaded from the directory save_pretrained
// wrote: the M-RoPE position ids exactly (get_rope_index), the interleaved cos/sin tables within 1e-6, the vision
// encoder's merged and DeepStack features within 1e-5 max abs, and the whole model's logits (1e-5 max abs on real
// tokens), loss (1e-5) and every parameter's gradient (1e-4 relative L2): the bounds of test_qwen2_5_vl.cpp and
// test_hf_parity.cpp. The batch: two images of different grids (1x8x12, 1x4x4) in one row, a left-padded row with
// a 1x4x8 image, a right-padded text-only row.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/hf_names.h"
#include "model/json_file.h"
#include "model/llava.h"
#include "model/mrope.h"
#include "model/pretrained.h"
#include "model/qwen3_vl_vision.h"
#include "model/safetensors.h"
#include "model/unit_hooks.h"
#include "model/activation_checkpoint.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

std::string full_dir() { return test::fixture("qwen3_vl/full"); }

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

TEST(Qwen3VLConfig, ReadsTheFixtureConfig) {
  const auto c = load_model_config(full_dir());
  ASSERT_TRUE(c.qwen3_vision);
  EXPECT_FALSE(c.qwen_vision);
  EXPECT_FALSE(c.vision);
  EXPECT_EQ(c.text.family, LlmFamily::kQwen2);
  EXPECT_TRUE(c.text.qk_norm);
  EXPECT_FALSE(c.text.qkv_bias);
  EXPECT_FALSE(c.text.attention_bias);
  EXPECT_EQ(c.text.dim_per_head(), 24);  // head_dim from the config, not hidden / heads (16)
  EXPECT_TRUE(c.text.mrope_interleaved);
  EXPECT_EQ(c.text.mrope_section, (std::vector<int64_t>{6, 3, 3}));
  ASSERT_TRUE(c.mrope);
  EXPECT_TRUE(c.mrope->interleaved);
  EXPECT_EQ(c.mrope->head_dim, 24);
  EXPECT_EQ(c.image_token_id, 60);
  EXPECT_EQ(c.qwen3_vision->deepstack_visual_indexes, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c.qwen3_vision->grid_side(), 4);
  EXPECT_EQ(c.qwen3_vision->hidden_act, "gelu_pytorch_tanh");
}

// The published files' layout (Qwen/Qwen3-VL-2B-Instruct's config.json fields): M-RoPE under text_config.rope_scaling
// with rope_theta beside it, the vision model_type "qwen3_vl", tied embeddings at the top.
TEST(Qwen3VLConfig, ReadsThePublishedLayout) {
  const auto j = nlohmann::json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "image_token_id": 151655,
    "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "tie_word_embeddings": true,
    "text_config": {"attention_bias": false, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 6144, "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
      "rope_theta": 5000000, "vocab_size": 151936},
    "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
      "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4096,
      "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048,
      "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}})");
  const auto c = parse_model_config(j, "config.json");
  ASSERT_TRUE(c.qwen3_vision && c.mrope);
  EXPECT_TRUE(c.text.tie_word_embeddings);
  EXPECT_TRUE(c.text.qk_norm);
  EXPECT_EQ(c.text.dim_per_head(), 128);
  EXPECT_EQ(c.text.num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(c.mrope->rope_theta, 5e6);
  EXPECT_TRUE(c.mrope->interleaved);
  EXPECT_EQ(c.mrope->mrope_section, (std::vector<int64_t>{24, 20, 20}));
  EXPECT_EQ(c.qwen3_vision->grid_side(), 48);
  EXPECT_EQ(c.qwen3_vision->deepstack_visual_indexes, (std::vector<int64_t>{5, 11, 17}));
  EXPECT_EQ(c.image_token_id, 151655);
}

TEST(Qwen3VLConfig, RejectsWhatItCannotComputeByName) {
  const auto good = load_json_file(full_dir() + "/config.json");
  auto message = [&](const std::function<void(nlohmann::json&)>& edit) -> std::string {
    auto j = good;
    edit(j);
    try {
      parse_model_config(j, "cfg.json");
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([](auto& j) { j["vision_config"]["num_position_embeddings"] = 15; })
                .find("num_position_embeddings 15 is not a square"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) { j["vision_config"]["deepstack_visual_indexes"] = {0, 3}; })
                .find("deepstack_visual_indexes holds 3, outside depth 3"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) { j["text_config"]["rope_parameters"]["mrope_interleaved"] = false; })
                .find("mrope_interleaved false"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) { j["text_config"]["rope_parameters"]["mrope_section"] = {6, 3, 2}; })
                .find("mrope_section"),
            std::string::npos);
  EXPECT_NE(message([](auto& j) { j.erase("text_config"); }).find("missing object 'text_config'"), std::string::npos);
  EXPECT_NE(message([](auto& j) { j["vision_config"]["hidden_act"] = "relu"; }).find("hidden_act 'relu'"),
            std::string::npos);
  EXPECT_EQ(message([](auto&) {}), "");
}

// Images' 3-D ids are Qwen2.5-VL's (model/mrope.h): transformers' Qwen3VLModel.get_rope_index gives the same.
TEST(Qwen3VL, PositionIdsAndDeltasEqualGetRopeIndex) {
  const auto c = load_model_config(full_dir());
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  const auto r = mrope_positions(ref.tensor("input.input_ids"), ref.tensor("input.attention_mask"),
                                 ref.tensor("input.image_grid_thw"), {}, {}, *c.mrope);
  EXPECT_TRUE(r.positions.equal(ref.tensor("position_ids")));
  EXPECT_TRUE(r.deltas.equal(ref.tensor("rope_deltas")));
}

// Interleaved M-RoPE (Qwen3VLTextRotaryEmbedding) within 1e-6; the plain sections of Qwen2.5-VL are far off.
TEST(Qwen3VL, InterleavedCosSinMatchTransformers) {
  const auto c = load_model_config(full_dir());
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  const auto pos = ref.tensor("position_ids");
  auto [cos, sin] = MRotaryEmbedding(*c.mrope).cos_sin(pos, at::kFloat);
  const double ec = (cos - ref.tensor("cos")).abs().max().item<double>(),
               es = (sin - ref.tensor("sin")).abs().max().item<double>();
  EXPECT_LT(ec, 1e-6);
  EXPECT_LT(es, 1e-6);
  std::cout << "Qwen3-VL M-RoPE: max cos diff " << ec << ", sin diff " << es << "\n";
  auto plain = *c.mrope;
  plain.interleaved = false;
  auto [pc, ps] = MRotaryEmbedding(plain).cos_sin(pos, at::kFloat);
  EXPECT_GT((pc - ref.tensor("cos")).abs().max().item<double>(), 0.1);
}

TEST(Qwen3VL, VisionFeaturesAndDeepStackMatchTransformers) {
  auto model = load_pretrained(full_dir());
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  at::NoGradGuard ng;
  std::vector<at::Tensor> deepstack;
  auto out = model->vision->token_features_stacked(ref.tensor("input.pixel_values"), ref.tensor("input.image_grid_thw"),
                                                    deepstack);
  ASSERT_EQ(out.sizes(), ref.tensor("vision.output").sizes());
  const double e = (out - ref.tensor("vision.output")).abs().max().item<double>();
  EXPECT_LT(e, 1e-5);
  std::cout << "Qwen3-VL vision: max feature diff " << e;
  ASSERT_EQ(deepstack.size(), 2u);
  for (size_t j = 0; j < deepstack.size(); ++j) {
    const auto r = ref.tensor("vision.deepstack." + std::to_string(j));
    ASSERT_EQ(deepstack[j].sizes(), r.sizes());
    const double ej = (deepstack[j] - r).abs().max().item<double>();
    EXPECT_LT(ej, 1e-5) << "DeepStack level " << j;
    std::cout << ", DeepStack " << j << " " << ej;
  }
  std::cout << "\n";
}

// Qwen3VLForConditionalGeneration as gmod's MultimodalLM: logits within 1e-5 on real tokens, loss within 1e-5,
// every parameter's gradient within 1e-4 relative L2 (1e-8 absolute floor as test_hf_parity.cpp), every parameter
// covered.
TEST(Qwen3VL, LogitsLossAndEveryGradientMatchTransformers) {
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
    const double diff = (grad - r).norm().item<double>(), rel = diff / std::max(r.norm().item<double>(), 1e-30);
    EXPECT_TRUE(rel < 1e-4 || diff < 1e-8) << "gradient of " << *g << ": relative L2 difference " << rel;
    if (diff >= 1e-8 && rel > worst) worst = rel, worst_name = *g;
    ++compared;
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_EQ(compared, load_json_file(full_dir() + "/reference.json").at("gradients").get<int>());
  std::cout << "Qwen3-VL: max logit diff " << logit_err << ", loss " << out.lm_loss.item<double>() << " vs "
            << ref.tensor("loss").item<double>() << ", worst relative gradient diff " << worst << " (" << worst_name
            << ")\n";
}

struct RecordingHooks : UnitHooks {
  void pre_forward(const torch::nn::Module& unit) override { order.push_back(&unit); }
  at::Tensor post_forward(const torch::nn::Module&, const at::Tensor& out) override { return out; }
  std::vector<const torch::nn::Module*> order;
};

// ZeRO-3 gathers the hooked units in forward order: the encoder's blocks with each DeepStack merger right after the
// block it reads (not where named_modules lists it), then the merger, then the decoder layers; a forward runs
// exactly those, in that order, with and without activation checkpointing.
TEST(Qwen3VL, ZeRO3UnitsAreListedInTheOrderTheyRun) {
  auto model = load_pretrained(full_dir());
  std::map<const torch::nn::Module*, std::string> name_of;
  for (const auto& m : model->named_modules()) name_of[m.value().get()] = m.key();
  std::vector<std::string> names;
  for (const auto& u : hooked_units(*model)) names.push_back(name_of.at(u.get()));
  const std::vector<std::string> expected = {"vision.blocks.0", "vision.deepstack_merger_list.0", "vision.blocks.1",
                                             "vision.blocks.2", "vision.deepstack_merger_list.1", "vision.merger",
                                             "llm.layers.0", "llm.layers.1", "llm.layers.2"};
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
    if (ck) {  // recomputed blocks give bitwise the loss of the plain forward
      model->llm->activation_checkpointing = parse_activation_checkpointing("none");
      model->vision->set_activation_checkpointing(false);
      EXPECT_TRUE(out.lm_loss.equal(model->forward(full_inputs(ref)).lm_loss));
    }
  }
}

// save_pretrained writes Qwen3VLForConditionalGeneration's layout (model.visual.*, model.language_model.*,
// lm_head.*; text_config with interleaved M-RoPE, vision_config with deepstack_visual_indexes): the tensor names
// are exactly those transformers' save_pretrained wrote for the fixture, and the directory loads back to bitwise
// the same logits.
TEST(Qwen3VL, SavePretrainedWritesTransformersNamesAndLoadsBack) {
  auto model = load_pretrained(full_dir());
  test::TempDir tmp;
  const auto dir = tmp.str("export");
  save_pretrained(*model, dir);
  std::set<std::string> ours, theirs;
  for (const auto& n : SafetensorsFile(dir + "/model.safetensors").names()) ours.insert(n);
  for (const auto& n : SafetensorsFile(full_dir() + "/model.safetensors").names()) theirs.insert(n);
  EXPECT_EQ(ours, theirs);
  const auto cfg = load_json_file(dir + "/config.json");
  EXPECT_EQ(cfg.at("architectures").at(0).get<std::string>(), "Qwen3VLForConditionalGeneration");
  EXPECT_EQ(cfg.at("text_config").at("model_type").get<std::string>(), "qwen3_vl_text");
  EXPECT_TRUE(cfg.at("text_config").at("rope_parameters").at("mrope_interleaved").get<bool>());
  EXPECT_EQ(cfg.at("vision_config").at("deepstack_visual_indexes").get<std::vector<int64_t>>(),
            (std::vector<int64_t>{0, 2}));
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  at::NoGradGuard ng;
  auto back = load_pretrained(dir);
  EXPECT_TRUE(back->forward(full_inputs(ref)).logits.equal(model->forward(full_inputs(ref)).logits));
}

}  // namespace

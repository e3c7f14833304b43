// Training config: defaults round-trip, typed overrides, and that validation reports every problem at once.
#include "trainer/train_config.h"

#include "tests/common/paths.h"

#include <gtest/gtest.h>

#include <fstream>

using gmod::TrainConfig;
using json = nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TrainConfig valid_config() {
  TrainConfig c;
  c.model.path = gmod::test::fixture("hf/llava_layer_m2");
  c.data.train = gmod::test::fixture("conversation/cases.json");
  c.data.tokenizer = gmod::test::fixture("tokenizer/sp/tokenizer.model");
  return c;
}

}  // namespace

TEST(TrainConfig, DefaultsRoundTripThroughJson) {
  TrainConfig c = gmod::train_config_from_json(gmod::to_json(TrainConfig{}));
  EXPECT_EQ(gmod::to_json(c), gmod::to_json(TrainConfig{}));
  EXPECT_EQ(c.optimizer.zero_stage, 1);
  EXPECT_TRUE(c.freeze.vision);
  EXPECT_EQ(c.resume, "auto");
}

TEST(TrainConfig, OverridesAreTypedByTheExistingField) {
  TrainConfig c = gmod::train_config_from_json(
      json{{"optimizer", {{"lr", 1}}}},
      {"optimizer.lr=0.5", "batch.micro_batch=3", "freeze.vision=false", "freeze.llm_layers=[\"0-1\",\"5\"]",
       "model.path=/x", "seed=7", "mod.config.skip_frac=0.25", "mod.config.mod_layers_idx=[1,2]",
       "model.activation_checkpointing=every_2"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.batch.micro_batch, 3);
  EXPECT_FALSE(c.freeze.vision);
  EXPECT_EQ(c.freeze.llm_layers, (std::vector<std::string>{"0-1", "5"}));
  EXPECT_EQ(c.model.path, "/x");
  EXPECT_EQ(c.seed, 7u);
  EXPECT_DOUBLE_EQ(c.mod.config.skip_frac, 0.25);
  EXPECT_EQ(c.mod.config.mod_layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.model.activation_checkpointing, "every_2");
}

TEST(TrainConfig, ReadingReportsEveryUnknownKeyAndWrongTypeAtOnce) {
  const json user{{"optimizr", {{"lr", 1}}},                 // unknown section
                  {"optimizer", {{"lr", "fast"}, {"betas", 1}}},  // wrong type, unknown key
                  {"batch", {{"micro_batch", 1.5}}},         // float for an int
                  {"deterministic", 1}};                     // int for a bool
  const std::string msg = error_of([&] {
    gmod::train_config_from_json(user, {"nope.x=1", "batch.grad_accum=two", "freeze.vision=yes", "seed"});
  });
  for (const char* part : {"optimizr: unknown key", "optimizer.lr: expected number, got string",
                           "optimizer.betas: unknown key", "batch.micro_batch: expected integer",
                           "deterministic: expected boolean", "--set nope.x: unknown key",
                           "--set batch.grad_accum=two: cannot parse as integer", "--set freeze.vision=yes",
                           "--set seed: expected key.path=value", "9 problem(s)"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
}

TEST(TrainConfig, ModConfigErrorsComeFromTheModParser) {
  const std::string msg = error_of([] { gmod::train_config_from_json(json::object(), {"mod.config.router=magic"}); });
  EXPECT_TRUE(has(msg, "router")) << msg;
}

TEST(TrainConfig, ValidationReportsAllProblemsAtOnce) {
  TrainConfig c = valid_config();
  EXPECT_TRUE(gmod::check_train_config(c, 1).empty());
  c.model.dtype = "fp16";
  c.data.train = "/no/such/train.json";
  c.batch.grad_accum = 0;
  c.optimizer.zero_stage = 3;
  c.checkpoint.keep_last = 1;
  c.freeze.llm_layers = {"3-1"};
  c.resume = "/no/such/checkpoint";
  c.mod.enabled = true;
  c.mod.rule = "sometimes";
  c.model.activation_checkpointing = "every_0";
  const std::string msg = error_of([&] { gmod::validate_train_config(c, 2); });
  for (const char* part : {"model.dtype", "data.train: /no/such/train.json does not exist", "batch.grad_accum: 0",
                           "optimizer.zero_stage: 3", "checkpoint.keep_last: 1", "freeze.llm_layers", "resume:",
                           "mod.rule", "model.activation_checkpointing: activation checkpointing \"every_0\"",
                           "9 problem(s)"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
}

TEST(TrainConfig, OptimizerCommunicationKeysAreReadAndValidated) {
  TrainConfig d;
  EXPECT_EQ(d.optimizer.reduce_dtype, "fp32");
  EXPECT_TRUE(d.optimizer.overlap_comm);
  EXPECT_FALSE(d.optimizer.accumulate_fp32);
  TrainConfig c = gmod::train_config_from_json(
      json{{"optimizer", {{"reduce_dtype", "param"}, {"overlap_comm", false}}}}, {"optimizer.accumulate_fp32=true"});
  EXPECT_EQ(c.optimizer.reduce_dtype, "param");
  EXPECT_FALSE(c.optimizer.overlap_comm);
  EXPECT_TRUE(c.optimizer.accumulate_fp32);
  // Saved with the run config.
  EXPECT_EQ(gmod::to_json(c)["optimizer"]["reduce_dtype"], "param");
  EXPECT_EQ(gmod::to_json(c)["optimizer"]["accumulate_fp32"], true);
  EXPECT_EQ(gmod::to_json(c)["optimizer"]["overlap_comm"], false);
  EXPECT_TRUE(has(error_of([] { gmod::train_config_from_json(json{{"optimizer", {{"overlap_comm", 1}}}}); }),
                  "optimizer.overlap_comm: expected boolean"));

  TrainConfig v = valid_config();
  v.optimizer.reduce_dtype = "fp16";
  v.optimizer.no_decay = {"bias", ""};
  const std::string msg = error_of([&] { gmod::validate_train_config(v, 1); });
  for (const char* part : {"optimizer.reduce_dtype: \"fp16\", expected fp32, bf16 or param",
                           "optimizer.no_decay[1]: empty substring", "2 problem(s)"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
  // bf16 reduction of fp32-accumulated gradients throws away what accumulate_fp32 keeps.
  v = valid_config();
  v.model.dtype = "bf16";
  v.optimizer.accumulate_fp32 = true;
  EXPECT_TRUE(gmod::check_train_config(v, 1).empty());
  v.optimizer.reduce_dtype = "param";
  auto errs = gmod::check_train_config(v, 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_TRUE(has(errs[0], "optimizer.reduce_dtype: \"param\" rounds the fp32-accumulated gradients")) << errs[0];
}

// HF Trainer / LLaVA: no weight decay on biases and LayerNorm/RMSNorm weights, by name.
TEST(TrainConfig, WeightDecayExcludesBiasesAndNormsByName) {
  const auto dflt = TrainConfig{}.optimizer.no_decay;
  for (const char* name : {"llm.layers.0.input_layernorm.weight", "llm.layers.3.post_attention_layernorm.weight",
                           "llm.norm.weight", "vision.pre_layrnorm.weight", "vision.post_layernorm.bias",
                           "vision.encoder.layers.0.layer_norm1.weight", "projector.linear_1.bias",
                           "vision.encoder.layers.0.self_attn.q_proj.bias"})
    EXPECT_FALSE(gmod::decays_weight(name, dflt)) << name;
  for (const char* name : {"llm.layers.0.self_attn.q_proj.weight", "llm.layers.0.mlp.down_proj.weight",
                           "llm.embed_tokens.weight", "lm_head.weight", "projector.linear_1.weight",
                           "llm.layers.2.router.weight"})
    EXPECT_TRUE(gmod::decays_weight(name, dflt)) << name;
  EXPECT_TRUE(gmod::decays_weight("llm.norm.weight", {})) << "[] decays everything";
  TrainConfig c = gmod::train_config_from_json(json::object(), {"optimizer.no_decay=[\"bias\"]"});
  EXPECT_EQ(c.optimizer.no_decay, (std::vector<std::string>{"bias"}));
  EXPECT_TRUE(gmod::decays_weight("llm.norm.weight", c.optimizer.no_decay));
  EXPECT_FALSE(gmod::decays_weight("fc.bias", c.optimizer.no_decay));
}

TEST(TrainConfig, GlobalBatchMustSplitOverRanks) {
  TrainConfig c = valid_config();
  c.batch.global_batch = 6;
  c.batch.micro_batch = 1;
  EXPECT_TRUE(gmod::check_train_config(c, 2).empty());
  EXPECT_TRUE(gmod::check_train_config(c, 3).empty());
  EXPECT_EQ(gmod::grad_accum_steps(c, 2), 3);
  EXPECT_EQ(gmod::grad_accum_steps(c, 3), 2);
  auto errs = gmod::check_train_config(c, 4);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_TRUE(has(errs[0], "not a multiple of world size (4)")) << errs[0];
  // Stage 2 on one rank is legal.
  c.optimizer.zero_stage = 2;
  EXPECT_TRUE(gmod::check_train_config(c, 1).empty());
}

TEST(TrainConfig, ReadsAFileAndRejectsBadJson) {
  gmod::test::TempDir dir;
  std::ofstream(dir.str("ok.json")) << R"({"optimizer": {"lr": 0.001}, // comment
    "run_dir": "r"})";
  EXPECT_DOUBLE_EQ(gmod::read_train_config(dir.str("ok.json")).optimizer.lr, 0.001);
  std::ofstream(dir.str("bad.json")) << "{\"a\": ";
  EXPECT_TRUE(has(error_of([&] { gmod::read_train_config(dir.str("bad.json")); }), "not valid JSON"));
  EXPECT_TRUE(has(error_of([&] { gmod::read_train_config(dir.str("none.json")); }), "cannot open"));
}

TEST(TrainConfig, LayerRanges) {
  EXPECT_EQ(gmod::parse_layer_ranges({"0-2", "5", "2"}), (std::vector<int>{0, 1, 2, 5}));
  EXPECT_THROW(gmod::parse_layer_ranges({"2-1"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"a"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"1-"}), std::invalid_argument);
}

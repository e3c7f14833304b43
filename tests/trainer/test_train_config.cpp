// Training config: defaults round-trip, typed overrides, and that validation reports every problem at once.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "tests/common/error_of.h"
#include "tests/common/paths.h"
#include "trainer/config/train_config.h"

using gmod::test::invalid_argument_of;

using gmod::TrainConfig;
using json = nlohmann::json;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_train_config {
namespace {

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TrainConfig valid_config() {
  TrainConfig c;
  c.model.path = gmod::test::fixture("hf/llava_layer_m2");
  c.data.train = gmod::test::fixture("conversation/cases.json");
  c.data.tokenizer = gmod::test::fixture("tokenizer/sp/tokenizer.model");
  c.data.max_len = 128;  // the fixture's max_position_embeddings
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
  const std::string msg = invalid_argument_of([&] {
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
  const std::string msg =
      invalid_argument_of([] { gmod::train_config_from_json(json::object(), {"mod.config.router=magic"}); });
  EXPECT_TRUE(has(msg, "router")) << msg;
}

TEST(TrainConfig, ValidationReportsAllProblemsAtOnce) {
  TrainConfig c = valid_config();
  EXPECT_TRUE(gmod::check_train_config(c, 1).empty());
  c.model.dtype = "fp16";
  c.data.train = "/no/such/train.json";
  c.batch.grad_accum = 0;
  c.optimizer.zero_stage = 4;
  c.checkpoint.keep_last = 1;
  c.freeze.llm_layers = {"3-1"};
  c.resume = "/no/such/checkpoint";
  c.mod.enabled = true;
  c.mod.rule = "sometimes";
  c.model.activation_checkpointing = "every_0";
  const std::string msg = invalid_argument_of([&] { gmod::validate_train_config(c, 2); });
  for (const char* part : {"model.dtype", "data.train: /no/such/train.json does not exist", "batch.grad_accum: 0",
                           "optimizer.zero_stage: 4", "checkpoint.keep_last: 1", "freeze.llm_layers", "resume:",
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
  EXPECT_TRUE(has(invalid_argument_of([] {
                    gmod::train_config_from_json(json{{"optimizer", {{"overlap_comm", 1}}}});
                  }),
                  "optimizer.overlap_comm: expected boolean"));

  TrainConfig v = valid_config();
  v.optimizer.reduce_dtype = "fp16";
  v.optimizer.no_decay = {"bias", ""};
  const std::string msg = invalid_argument_of([&] { gmod::validate_train_config(v, 1); });
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

TEST(TrainConfig, OptimizerOffloadIsReadAndValidated) {
  EXPECT_EQ(TrainConfig{}.optimizer.offload, "none");
  TrainConfig c = gmod::train_config_from_json(json{{"optimizer", {{"offload", "cpu"}}}});
  EXPECT_EQ(c.optimizer.offload, "cpu");
  EXPECT_EQ(gmod::to_json(c)["optimizer"]["offload"], "cpu");  // saved with the run config
  TrainConfig v = valid_config();
  v.optimizer.offload = "cpu";
  EXPECT_TRUE(gmod::check_train_config(v, 1).empty());
  v.optimizer.offload = "nvme";
  const auto errs = gmod::check_train_config(v, 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_TRUE(has(errs[0], "optimizer.offload: \"nvme\", expected \"none\" or \"cpu\"")) << errs[0];
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
  EXPECT_TRUE(
      has(invalid_argument_of([&] { gmod::read_train_config(dir.str("bad.json")); }), "not valid JSON"));
  EXPECT_TRUE(
      has(invalid_argument_of([&] { gmod::read_train_config(dir.str("none.json")); }), "cannot open"));
}

TEST(TrainConfig, LayerRanges) {
  EXPECT_EQ(gmod::parse_layer_ranges({"0-2", "5", "2"}), (std::vector<int>{0, 1, 2, 5}));
  EXPECT_THROW(gmod::parse_layer_ranges({"2-1"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"a"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"1-"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"-1"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({" 1"}), std::invalid_argument);
  EXPECT_THROW(gmod::parse_layer_ranges({"0-99999999999999999999"}), std::invalid_argument);
  // Checked against the model's layers before anything is expanded: "0-2147483647" used to insert one set
  // entry per index until memory ran out.
  EXPECT_EQ(gmod::parse_layer_ranges({"0-1"}, 2), (std::vector<int>{0, 1}));
  const std::string msg = invalid_argument_of([] { gmod::parse_layer_ranges({"0-2147483647"}, 6); });
  EXPECT_TRUE(
      has(msg, "layer range \"0-2147483647\": layer 2147483647 does not exist (the model has 6 layers, 0-5)"))
      << msg;
  EXPECT_TRUE(has(invalid_argument_of([] { gmod::parse_layer_ranges({"6"}, 6); }), "layer 6 does not exist"));
  // Without a model: indices up to kMaxLayerIndex.
  EXPECT_TRUE(has(invalid_argument_of([] { gmod::parse_layer_ranges({"0-2147483647"}); }),
                  "layer indices go up to 65535"));
  EXPECT_EQ(gmod::parse_layer_ranges({"65535"}), (std::vector<int>{65535}));
}

// 4294967297 = 2^32 + 1 used to become 1 (batch.micro_batch) and 4294967304 = 2^32 + 8 became 8
// (data.max_len), from the JSON file and from --set alike.
TEST(TrainConfig, IntegersBeyond32BitsAreNamedErrorsNotWrapped) {
  std::string msg = invalid_argument_of([] {
    gmod::train_config_from_json(
        json{{"batch", {{"micro_batch", 4294967297ull}}}, {"checkpoint", {{"every", -4294967296ll}}}},
        {"data.max_len=4294967304", "mod.config.mod_layers_idx=[1,4294967297]"}, "c.json");
  });
  for (const char* part :
       {"c.json: 4 problem(s)",
        "batch.micro_batch: 4294967297 is out of range (a 32-bit integer, at most 2147483647)",
        "checkpoint.every: -4294967296 is out of range",
        "data.max_len: 4294967304 is out of range (a 32-bit integer, at most 2147483647) (from --set)",
        "mod.config.mod_layers_idx[1]: 4294967297 is out of range"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
  // The edges: INT_MAX reads, INT_MAX + 1 does not; --set integers are decimal only.
  EXPECT_EQ(
      gmod::train_config_from_json(json::object(), {"schedule.max_steps=2147483647"}).schedule.max_steps,
      2147483647);
  EXPECT_TRUE(has(invalid_argument_of([] {
                    gmod::train_config_from_json(json::object(), {"schedule.max_steps=2147483648"});
                  }),
                  "schedule.max_steps: 2147483648 is out of range"));
  EXPECT_TRUE(has(
      invalid_argument_of([] { gmod::train_config_from_json(json::object(), {"schedule.max_steps=0x10"}); }),
      "--set schedule.max_steps=0x10: cannot parse as integer (not a decimal integer)"));
  EXPECT_TRUE(
      has(invalid_argument_of(
              [] { gmod::train_config_from_json(json::object(), {"seed=99999999999999999999"}); }),
          "--set seed=99999999999999999999: cannot parse as integer (out of range of a 64-bit integer)"));
  // int64_t fields take 64 bits.
  const TrainConfig big = gmod::train_config_from_json(json{{"data", {{"max_image_pixels", 5000000000ll}}}},
                                                       {"data.preflight_records=4294967296"});
  EXPECT_EQ(big.data.max_image_pixels, 5000000000ll);
  EXPECT_EQ(big.data.preflight_records, 4294967296ll);
  EXPECT_TRUE(has(invalid_argument_of([] {
                    gmod::train_config_from_json(json{{"data", {{"max_image_pixels", 9223372036854775808ull}}}});
                  }),
                  "data.max_image_pixels: 9223372036854775808 is out of range (a 64-bit integer"));
  // uint64 fields take the full range.
  EXPECT_EQ(gmod::train_config_from_json(json::object(), {"seed=18446744073709551615"}).seed,
            18446744073709551615ull);
}

TEST(TrainConfig, NonFiniteFloatsAreNamedErrors) {
  // From --set (JSON itself has no NaN literal).
  const std::string msg = invalid_argument_of([] {
    gmod::train_config_from_json(json::object(), {"optimizer.max_grad_norm=nan", "optimizer.eps=inf",
                                                  "data.max_bad_fraction=nan", "mod.config.skip_frac=-inf"});
  });
  for (const char* part :
       {"4 problem(s)", "optimizer.max_grad_norm: nan is not a finite number (from --set)",
        "optimizer.eps: inf is not a finite number", "data.max_bad_fraction: nan is not a finite number",
        "mod.config.skip_frac: -inf is not a finite number"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
  // A config built in code goes through validation, which checks every float too.
  TrainConfig c = valid_config();
  c.optimizer.max_grad_norm = std::nan("");
  c.optimizer.eps = HUGE_VAL;
  c.data.max_bad_fraction = std::nan("");
  c.metrics.peak_tflops = -HUGE_VAL;
  const auto errs = gmod::check_train_config(c, 1);
  const std::string all = [&] {
    std::string a;
    for (auto& x : errs) a += x + "\n";
    return a;
  }();
  for (const char* part :
       {"optimizer.max_grad_norm: nan is not a finite number", "optimizer.eps: inf is not a finite number",
        "data.max_bad_fraction: nan is not a finite number",
        "metrics.peak_tflops: -inf is not a finite number"})
    EXPECT_TRUE(has(all, part)) << "missing \"" << part << "\" in:\n" << all;
}

// gmod train's reading: reading problems (unknown keys, types, ranges, non-finite values) and validation
// problems of the same file in one message naming it; a value that could not be read is validated at its
// default, and what validation says about that key is left out.
TEST(TrainConfig, ReadingAndValidationProblemsComeTogether) {
  gmod::test::TempDir dir;
  json j = gmod::to_json(valid_config());
  j["batch"]["micro_batch"] = 4294967297ull;
  j["data"]["max_len"] =
      4294967304ull;  // at its default 2048 it would also be "beyond the model's positions"
  j["optimizer"]["lr"] = -1;
  j["optimizer"]["min_lr"] = -2;
  j["model"]["device"] = "gpu";
  j["optimizr"] = json::object();
  std::ofstream(dir.str("c.json")) << j.dump();
  const std::string msg = invalid_argument_of(
      [&] { gmod::read_valid_train_config(dir.str("c.json"), {"optimizer.eps=nan"}, 1); });
  for (const std::string& part :
       {dir.str("c.json") + ": invalid training config, 7 problem(s):", std::string("optimizr: unknown key"),
        std::string("batch.micro_batch: 4294967297 is out of range"),
        std::string("data.max_len: 4294967304 is out of range"),
        std::string("optimizer.eps: nan is not a finite number (from --set)"),
        std::string("optimizer.lr: must be > 0"), std::string("optimizer.min_lr: must be in [0, lr]"),
        std::string("model.device: \"gpu\"")})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in:\n" << msg;
  EXPECT_FALSE(has(msg, "beyond the model's")) << msg;
  EXPECT_FALSE(has(msg, "optimizer.eps: must be")) << msg;
  // A good file reads.
  std::ofstream(dir.str("ok.json")) << gmod::to_json(valid_config()).dump();
  EXPECT_EQ(gmod::read_valid_train_config(dir.str("ok.json"), {"batch.micro_batch=2"}, 1).batch.micro_batch,
            2);
  // Without `problems`, reading throws as before (gmod plan, gmod export).
  EXPECT_THROW(gmod::read_train_config(dir.str("c.json")), std::invalid_argument);
}

TEST(TrainConfig, DeviceIsCpuCudaOrCudaN) {
  int index = 0;
  EXPECT_TRUE(gmod::parse_device("cpu", &index));
  EXPECT_EQ(index, -1);
  EXPECT_TRUE(gmod::parse_device("cuda", &index));
  EXPECT_EQ(index, -1);
  EXPECT_TRUE(gmod::parse_device("cuda:3", &index));
  EXPECT_EQ(index, 3);
  for (const char* bad :
       {"gpu", "cudax", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "CPU", "cuda:99999", "mps"})
    EXPECT_FALSE(gmod::parse_device(bad, &index)) << bad;
  TrainConfig c = valid_config();
  c.model.device = "tpu";
  auto errs = gmod::check_train_config(c, 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0], "model.device: \"tpu\", expected cpu, cuda or cuda:N");
  // cuda:N: fine with one rank per node (e.g. one rank per node on several nodes), refused when ranks share a
  // node.
  c.model.device = "cuda:1";
  EXPECT_TRUE(gmod::check_train_config(c, 4, 1).empty());
  errs = gmod::check_train_config(c, 2, 2);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_TRUE(has(errs[0], "model.device: \"cuda:1\" names one GPU, but 2 ranks run on this node"))
      << errs[0];
  c.model.device = "cuda";
  EXPECT_TRUE(gmod::check_train_config(c, 2, 2).empty());
}

// The fixture model (tests/fixtures/hf/llava_layer_m2): 2 decoder layers, 128 positions.
TEST(TrainConfig, SettingsMustFitTheModel) {
  TrainConfig c = valid_config();
  EXPECT_TRUE(gmod::check_train_config(c, 1).empty());
  c.data.max_len = 129;
  c.freeze.llm_layers = {"0-2147483647"};
  c.mod.enabled = true;
  c.mod.config.mod_layers = {1, 2};
  auto errs = gmod::check_train_config(c, 1);
  std::string all;
  for (auto& x : errs) all += x + "\n";
  EXPECT_EQ(errs.size(), 3u) << all;
  for (const char* part :
       {"data.max_len: 129 is beyond the model's max_position_embeddings (128, ",
        "freeze.llm_layers: layer range \"0-2147483647\": layer 2147483647 does not exist (the model has 2",
        "mod.config.mod_layers_idx[1]: layer 2 does not exist (the model has 2 layers"})
    EXPECT_TRUE(has(all, part)) << "missing \"" << part << "\" in:\n" << all;
  c = valid_config();
  c.mod.enabled = true;
  c.mod.rule = "layers:1,5";
  errs = gmod::check_train_config(c, 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_TRUE(has(errs[0], "mod.rule: conversion rule layers:1,5: layer 5 outside [0, 2)")) << errs[0];
  // The model's own config problems come with the rest.
  gmod::test::TempDir tmp;
  std::ofstream(tmp.str("config.json")) << R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 4294967298, "num_attention_heads": 2, "rms_norm_eps": -1})";
  c = valid_config();
  c.model.path = tmp.str();
  c.data.tokenizer = gmod::test::fixture("tokenizer/sp/tokenizer.model");
  c.optimizer.lr = 0;
  errs = gmod::check_train_config(c, 1);
  all.clear();
  for (auto& x : errs) all += x + "\n";
  for (const char* part :
       {"model: invalid model config (2 problems)", "'num_hidden_layers' is out of range: 4294967298",
        "'rms_norm_eps' must be positive, got -1", "optimizer.lr: must be > 0"})
    EXPECT_TRUE(has(all, part)) << "missing \"" << part << "\" in:\n" << all;
}

TEST(TrainConfig, ResourceBoundsAndProducts) {
  TrainConfig c = valid_config();
  c.data.workers = 100000;
  c.data.prefetch = 0;
  c.batch.micro_batch = 65536;
  c.batch.grad_accum = 65536;
  const auto errs = gmod::check_train_config(c, 1);
  std::string all;
  for (auto& x : errs) all += x + "\n";
  EXPECT_EQ(errs.size(), 3u) << all;
  for (const char* part :
       {"data.workers: 100000, expected 0 to 256", "data.prefetch: 0, expected 1 to 4096",
        "world size (1) x micro_batch (65536) x grad_accum (65536) samples per step is out of range"})
    EXPECT_TRUE(has(all, part)) << "missing \"" << part << "\" in:\n" << all;
}

TEST(TrainConfig, ZeroStage3IsSelectableAndItsKnobsAreChecked) {
  TrainConfig c = valid_config();
  c.optimizer.zero_stage = 3;
  EXPECT_TRUE(gmod::check_train_config(c, 2).empty());
  c.optimizer.zero3_prefetch = 9;
  c.model.dtype = "bf16";
  c.optimizer.accumulate_fp32 = true;
  const auto errors = gmod::check_train_config(c, 2);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_TRUE(has(errors[0], "optimizer.zero3_prefetch: 9")) << errors[0];
  EXPECT_TRUE(has(errors[1], "optimizer.accumulate_fp32: not available with zero_stage 3")) << errors[1];
  EXPECT_EQ(gmod::train_config_from_json(json{{"optimizer", {{"zero3_prefetch", 2}}}}).optimizer.zero3_prefetch, 2);
}

}  // namespace test_train_config

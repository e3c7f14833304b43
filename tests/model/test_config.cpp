// Model config validation (model/config.h): 64-bit reads with range checks, strict types, positivity and
// consistency of the LLaMA, CLIP and LLaVA fields, every problem of a file at once with the file and key.
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "tests/common/paths.h"

namespace gmod {
namespace {

using json = nlohmann::json;

std::string error_of(const json& j, const std::string& source = "cfg.json") {
  try {
    parse_model_config(j, source);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

// A LLaVA config in transformers' layout that parses (checked by the first test).
json llava() {
  return {{"text_config",
           {{"vocab_size", 64},
            {"hidden_size", 32},
            {"intermediate_size", 48},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 128},
            {"rms_norm_eps", 1e-6}}},
          {"vision_config",
           {{"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"image_size", 16},
            {"patch_size", 4}}},
          {"image_token_index", 63}};
}

TEST(ModelConfigValidation, TheBaseConfigParses) {
  EXPECT_EQ(error_of(llava()), "");
  const LlavaConfig c = parse_model_config(llava(), "cfg.json");
  EXPECT_EQ(c.text.num_hidden_layers, 2);
  EXPECT_EQ(c.image_seq_length(), 16);  // (16 / 4)^2 patches, CLS dropped
}

TEST(ModelConfigValidation, IntegersAreReadAs64BitsAndRangeChecked) {
  json j = llava();
  j["text_config"]["num_hidden_layers"] = 4294967302ull;  // 2^32 + 6: used to load 6 layers
  std::string err = error_of(j);
  EXPECT_TRUE(has(err, "cfg.json: text_config: field 'num_hidden_layers' is out of range: 4294967302"))
      << err;
  j = llava();
  j["text_config"]["hidden_size"] = -4294967264ll;  // -2^32 + 32: used to wrap to 32
  err = error_of(j);
  EXPECT_TRUE(has(err, "field 'hidden_size' is out of range: -4294967264")) << err;
  // Floats and booleans are not integers (2.5 used to become 2, true 1).
  j = llava();
  j["text_config"]["num_hidden_layers"] = 2.5;
  j["text_config"]["num_attention_heads"] = true;
  j["text_config"]["tie_word_embeddings"] = 1;
  err = error_of(j);
  EXPECT_TRUE(has(err, "field 'num_hidden_layers' has the wrong type (number: 2.5), expected an integer"))
      << err;
  EXPECT_TRUE(has(err, "field 'num_attention_heads' has the wrong type (boolean")) << err;
  EXPECT_TRUE(has(err, "field 'tie_word_embeddings' has the wrong type (number: 1), expected true or false"))
      << err;
  // Token ids too.
  j = llava();
  j["text_config"]["eos_token_id"] = 4294967298ull;
  EXPECT_TRUE(has(error_of(j), "field 'eos_token_id' is out of range")) << error_of(j);
}

TEST(ModelConfigValidation, ValuesThatCannotBeRight) {
  const std::pair<const char*, json> text_cases[] = {
      {"'rms_norm_eps' must be positive, got -1", {{"rms_norm_eps", -1}}},
      {"'head_dim' must be positive, got -2", {{"head_dim", -2}}},
      {"'max_position_embeddings' must be positive, got 0", {{"max_position_embeddings", 0}}},
      {"'rope_theta' must be positive, got 0", {{"rope_theta", 0}}},
      {"'intermediate_size' must be positive, got 0", {{"intermediate_size", 0}}},
      {"num_attention_heads (4) is not a multiple of num_key_value_heads (3)", {{"num_key_value_heads", 3}}},
      {"hidden_size (32) is not a multiple of num_attention_heads (5) and no head_dim is given",
       {{"num_attention_heads", 5}, {"num_key_value_heads", 5}}},
      {"head dimension 3 must be even", {{"head_dim", 3}}},
      {"'eos_token_id' 64 is outside the vocabulary (vocab_size 64)", {{"eos_token_id", 64}}},
      {"field 'rms_norm_eps' has the wrong type (string", {{"rms_norm_eps", "small"}}},
  };
  for (const auto& [expect, patch] : text_cases) {
    json j = llava();
    j["text_config"].update(patch);
    const std::string err = error_of(j);
    EXPECT_TRUE(has(err, std::string("cfg.json: text_config: ") + expect)) << patch.dump() << ":\n" << err;
  }
  // head_dim given explicitly need not be hidden_size / heads (e.g. Gemma-style configs).
  json ok = llava();
  ok["text_config"]["head_dim"] = 16;
  EXPECT_EQ(error_of(ok), "");

  const std::pair<const char*, json> vision_cases[] = {
      {"'num_attention_heads' must be positive, got 0", {{"num_attention_heads", 0}}},  // was SIGFPE
      {"vision hidden_size (16) is not a multiple of num_attention_heads (3)", {{"num_attention_heads", 3}}},
      {"image_size (16) is not a multiple of patch_size (5)", {{"patch_size", 5}}},
      {"'patch_size' must be positive, got 0", {{"patch_size", 0}}},
      {"'image_size' must be positive, got -16", {{"image_size", -16}}},
      {"'layer_norm_eps' must be positive, got 0", {{"layer_norm_eps", 0}}},
      {"'hidden_size' must be positive, got 0", {{"hidden_size", 0}}},
  };
  for (const auto& [expect, patch] : vision_cases) {
    json j = llava();
    j["vision_config"].update(patch);
    const std::string err = error_of(j);
    EXPECT_TRUE(has(err, std::string("cfg.json: vision_config: ") + expect)) << patch.dump() << ":\n" << err;
  }
  // An image must leave room in the context: (64 / 4)^2 = 256 patches >= 128 positions.
  json j = llava();
  j["vision_config"]["image_size"] = 64;
  EXPECT_TRUE(
      has(error_of(j), "one image takes 16^2 positions, not fewer than max_position_embeddings (128)"))
      << error_of(j);
}

TEST(ModelConfigValidation, ModFieldsMustHaveTheirTypes) {
  json j = llava();
  j["mod"] = "yes please";  // used to load as a dense model
  EXPECT_TRUE(
      has(error_of(j), "cfg.json: field 'mod' has the wrong type (string: \"yes please\"), expected the MoD"))
      << error_of(j);
  j = llava();
  j["mod_enable"] = "true";
  j["mod_layers_idx"] = {1, 2};
  std::string err = error_of(j);
  EXPECT_TRUE(has(err, "field 'mod_enable' has the wrong type (string)")) << err;
  EXPECT_TRUE(has(
      err, "field 'mod_layers_idx' must be a list of layer indices in [0, num_hidden_layers = 2), got [1,2]"))
      << err;
  j = llava();
  j["mod"] = {{"mod_layers_idx", {1, 4294967297ull}}};  // read as ints elsewhere: would wrap to layer 1
  err = error_of(j);
  EXPECT_TRUE(
      has(err, "field 'mod.mod_layers_idx' must be a list of layer indices in [0, num_hidden_layers = 2)"))
      << err;
  j = llava();
  j["mod"] = nullptr;  // absent
  EXPECT_EQ(error_of(j), "");
}

TEST(ModelConfigValidation, EveryProblemOfTheFileAtOnceWithFileAndKey) {
  test::TempDir tmp;
  json j = llava();
  j["text_config"].update({{"rms_norm_eps", -1}, {"head_dim", -2}, {"max_position_embeddings", 0}});
  j["vision_config"]["num_attention_heads"] = 0;
  j["mod"] = "yes please";
  std::ofstream(tmp.str("config.json")) << j.dump();
  std::string err;
  try {
    load_model_config(tmp.str());
  } catch (const std::exception& e) {
    err = e.what();
  }
  const std::string file = tmp.str("config.json");
  const std::vector<std::string> parts = {"invalid model config (5 problems)",
                                          file + ": text_config: 'rms_norm_eps' must be positive",
                                          file + ": text_config: 'head_dim' must be positive",
                                          file + ": text_config: 'max_position_embeddings'",
                                          file + ": vision_config: 'num_attention_heads' must be positive",
                                          file + ": field 'mod' has the wrong type"};
  for (const std::string& part : parts)
    EXPECT_TRUE(has(err, part)) << "missing \"" << part << "\" in:\n" << err;
}

}  // namespace
}  // namespace gmod

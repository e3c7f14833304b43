// LoRA adapters (model/lora.h, model/lora_peft.h): the adapted forward against the merged weights computed
// independently (W + alpha/r B A by hand), dropout masks reproduced by activation checkpointing's recompute,
// PEFT files read back, and the named errors. Parity with PEFT itself: tests/model/check_lora_peft.py (ctest
// lora_peft).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/lora.h"
#include "model/lora_peft.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

namespace {

using namespace gmod;

std::shared_ptr<MultimodalLM> tiny_llama() {
  return load_pretrained(test::fixture("hf/llama_untied_gqa"), at::kFloat, at::kCPU);
}

LoraConfig lora(int r, double alpha, double dropout = 0.0) {
  LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.dropout = dropout;
  return c;
}

ModelInputs inputs(int64_t vocab) {
  ModelInputs in;
  in.input_ids = at::randint(vocab, {2, 7}, at::make_generator<at::CPUGeneratorImpl>(5), at::kLong);
  in.labels = in.input_ids.clone();
  return in;
}

// B random (as after training), so the adapters change the output.
void randomize_b(MultimodalLM& m, uint64_t seed) {
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, lin] : lora_modules(m)) lora_adapter_of(*lin)->lora_B->weight.normal_(0, 0.05, gen);
}

TEST(Lora, AttachesToTargetsWithZeroBAndKeepsOutput) {
  auto m = tiny_llama();
  m->eval();
  const ModelInputs in = inputs(m->config.text.vocab_size);
  at::NoGradGuard ng;
  const at::Tensor before = m->forward(in).logits;
  LoraConfig c = lora(4, 8);
  c.targets = {"q_proj", "v_proj"};
  const LoraAttachment att = attach_lora(*m, c, 1);
  const int layers = m->config.text.num_hidden_layers;
  ASSERT_EQ(int(att.modules.size()), 2 * layers);
  EXPECT_EQ(att.modules[0], "llm.layers.0.self_attn.q_proj");
  EXPECT_EQ(att.modules[1], "llm.layers.0.self_attn.v_proj");
  int adapters = 0;
  for (const auto& p : m->named_parameters())
    if (is_lora_parameter(p.key())) ++adapters;
  EXPECT_EQ(adapters, 4 * layers);
  EXPECT_TRUE(m->named_parameters().contains("llm.layers.1.self_attn.v_proj.lora_B.weight"));
  EXPECT_TRUE(at::equal(m->forward(in).logits, before)) << "B = 0: the adapted model is the base model";
}

// The adapted forward equals the base model with W + (alpha/r) B A written into its weights, computed here by
// hand.
TEST(Lora, AdaptedForwardEqualsHandMergedWeights) {
  auto m = tiny_llama();
  m->eval();
  auto ref = tiny_llama();
  ref->eval();
  attach_lora(*m, lora(4, 12), 1);
  randomize_b(*m, 2);
  {
    at::NoGradGuard ng;
    auto params = ref->named_parameters();
    for (const auto& [name, lin] : lora_modules(*m)) {
      const auto a = lora_adapter_of(*lin);
      EXPECT_DOUBLE_EQ(a->scale, 3.0);
      params[name + ".weight"].add_(at::mm(a->lora_B->weight, a->lora_A->weight) * 3.0);
    }
  }
  const ModelInputs in = inputs(m->config.text.vocab_size);
  at::NoGradGuard ng;
  const at::Tensor got = m->forward(in).logits, want = ref->forward(in).logits;
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
  EXPECT_FALSE(at::allclose(got, tiny_llama()->forward(in).logits, 1e-3, 1e-3)) << "the adapters must matter";
  // merge_lora does the same and removes the adapters.
  EXPECT_EQ(merge_lora(*m), 7 * m->config.text.num_hidden_layers);
  EXPECT_TRUE(lora_modules(*m).empty());
  for (const auto& p : m->named_parameters()) EXPECT_FALSE(is_lora_parameter(p.key())) << p.key();
  EXPECT_TRUE(at::allclose(m->forward(in).logits, want, 1e-5, 1e-5));
}

// Gradients of the adapters with dropout: the recompute of checkpointed layers draws the first pass's masks,
// so checkpointing changes nothing (bitwise in fp32); another pass draws other masks.
TEST(Lora, DropoutIsReproducedByActivationCheckpointing) {
  auto grads = [](const std::string& ckpt, int64_t pass) {
    auto m = tiny_llama();
    m->train();
    for (const auto& p : m->parameters()) p.set_requires_grad(false);
    const LoraAttachment att = attach_lora(*m, lora(4, 8, 0.3), 1);
    randomize_b(*m, 2);
    att.stream->seed = 77;
    att.stream->pass = pass;
    m->llm->activation_checkpointing = parse_activation_checkpointing(ckpt);
    m->forward(inputs(m->config.text.vocab_size)).lm_loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : m->named_parameters())
      if (is_lora_parameter(p.key())) {
        EXPECT_TRUE(p.value().grad().defined()) << p.key();
        g.push_back(p.value().grad().clone());
      }
    return g;
  };
  const auto plain = grads("none", 3), ckpt = grads("full", 3), other = grads("full", 4);
  ASSERT_EQ(plain.size(), ckpt.size());
  bool any_diff = false;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << "adapter gradient " << i;
    any_diff = any_diff || !at::equal(plain[i], other[i]);
  }
  EXPECT_TRUE(any_diff) << "another pass must draw other dropout masks";
  // Dropout off in eval mode: the output does not depend on the pass.
  auto m = tiny_llama();
  const LoraAttachment att = attach_lora(*m, lora(4, 8, 0.5), 1);
  randomize_b(*m, 2);
  m->eval();
  at::NoGradGuard ng;
  const ModelInputs in = inputs(m->config.text.vocab_size);
  att.stream->pass = 1;
  const at::Tensor a = m->forward(in).logits;
  att.stream->pass = 2;
  EXPECT_TRUE(at::equal(a, m->forward(in).logits));
}

TEST(Lora, PeftFilesReadBackIntoAFreshModel) {
  test::TempDir t;
  auto m = tiny_llama();
  LoraConfig c = lora(2, 4);
  c.targets = {"o_proj", "down_proj"};
  attach_lora(*m, c, 1);
  randomize_b(*m, 3);
  save_peft_adapter(*m, c, t.str("adapter"), "base");
  nlohmann::json j;
  std::ifstream cfg_in(t.str("adapter/adapter_config.json"));
  cfg_in >> j;
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 2);
  EXPECT_EQ(j["target_modules"], nlohmann::json::array({"o_proj", "down_proj"}));
  SafetensorsFile f(t.str("adapter/adapter_model.safetensors"));
  EXPECT_TRUE(f.has("base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"));
  EXPECT_TRUE(f.has("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_EQ(f.names().size(), size_t(4 * m->config.text.num_hidden_layers));

  auto back = tiny_llama();
  load_peft_adapter(*back, t.str("adapter"));
  const auto want = m->named_parameters();
  for (const auto& p : back->named_parameters())
    if (is_lora_parameter(p.key())) {
      EXPECT_TRUE(at::equal(p.value(), want[p.key()])) << p.key();
    }
}

TEST(Lora, BadConfigsAndAdaptersAreNamedErrors) {
  auto m = tiny_llama();
  LoraConfig c = lora(4, 8);
  c.targets = {"qproj"};
  try {
    attach_lora(*m, c, 1);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lora.targets [qproj] match no linear layer"), std::string::npos)
        << e.what();
  }
  c = lora(4, 8);
  c.bias = "all";
  EXPECT_NE(check_lora_config(c).at(0).find("lora.bias: \"all\" is not built"), std::string::npos);
  c = lora(4, 8, 1.0);
  EXPECT_NE(check_lora_config(c).at(0).find("lora.dropout"), std::string::npos);

  test::TempDir t;
  attach_lora(*m, lora(2, 4), 1);
  save_peft_adapter(*m, lora(2, 4), t.str("a"), "base");
  nlohmann::json j;
  std::ifstream a_in(t.str("a/adapter_config.json"));
  a_in >> j;
  j["use_dora"] = true;
  std::ofstream(t.str("a/adapter_config.json")) << j.dump();
  try {
    load_peft_adapter(*tiny_llama(), t.str("a"));
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("adapter_config.json: \"use_dora\": true is not built"),
              std::string::npos)
        << e.what();
  }
  j["use_dora"] = false;
  // The file holds adapters of modules the config does not name.
  j["target_modules"] = nlohmann::json::array({"q_proj"});
  std::ofstream(t.str("a/adapter_config.json")) << j.dump();
  try {
    load_peft_adapter(*tiny_llama(), t.str("a"));
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to no adapter of this model"), std::string::npos)
        << e.what();
  }
}

}  // namespace

// End-to-end LoRA runs of `gmod train` (the executable, 2 ranks under mpirun) on the demo dataset and the
// tiny demo model converted to γ-MoD: the adapters go on after the conversion, the LLM's own weights stay
// frozen, the router and the adapters train, and a stopped-and-resumed run (with adapter dropout and
// activation checkpointing) is bitwise the uninterrupted one; `gmod export` writes PEFT's adapter beside the
// base, and `gmod merge` merges it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/demo_dataset.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"
#include "trainer/checkpoint/checkpoint.h"

namespace {

using json = nlohmann::json;
using gmod::test::TempDir;
using namespace gmod::e2e;

const std::vector<std::string> kLora = {"lora.r=4", "lora.alpha=8", "lora.dropout=0.1",
                                        "model.activation_checkpointing=full", "schedule.max_steps=4"};

std::map<std::string, at::Tensor> model_of(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  for (auto& [n, t] : gmod::CheckpointReader(dir).read_model()) out[n] = t;
  return out;
}

// 4 steps straight == 2 steps, stop, resume, 2 steps: adapters, router, frozen weights, optimizer state and
// per-step metrics bitwise; only adapters, the router and the projector changed during training.
TEST(TrainLoraE2E, LoraGammaModResumesBitwise) {
  TempDir t;
  const std::string u = t.str("uninterrupted"), s = t.str("stopped");
  std::vector<std::string> stop = kLora;
  stop.push_back("schedule.exit_at_step=2");
  ASSERT_EQ(gmod_train(2, write_config(u), kLora), 0) << slurp(u + ".config.json.log");
  ASSERT_EQ(gmod_train(2, write_config(s), stop), 0) << slurp(s + ".config.json.log");
  ASSERT_EQ(gmod_train(2, write_config(s), kLora), 0) << slurp(s + ".config.json.log");
  const std::string log = slurp(s + ".config.json.log");
  EXPECT_NE(log.find("resume: " + ckpt(s, 2)), std::string::npos) << log;
  EXPECT_NE(log.find("lora: r 4"), std::string::npos) << log;

  std::vector<int64_t> order;
  auto mu = step_metrics(u), ms = step_metrics(s, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4}));
  ASSERT_EQ(mu.size(), 4u);
  for (int64_t k = 1; k <= 4; ++k)
    for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "lr", "tokens", "skip_ratio"})
      EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  expect_same_model(ckpt(u, 4), ckpt(s, 4));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 4), n), flat_optimizer(ckpt(s, 4), n))) << n;

  // What trained: the optimizer holds the adapters, the router and the projector, nothing of the frozen LLM.
  const auto m2 = model_of(ckpt(s, 2)), m4 = model_of(ckpt(u, 4));
  int adapters = 0;
  int64_t trainable = 0;
  for (const auto& [name, w] : m4) {
    const bool lora =
        name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
    const bool trains = lora || name.find("router") != std::string::npos || name.rfind("projector.", 0) == 0;
    adapters += lora;
    if (trains) trainable += w.numel();
    if (!trains && name.rfind("vision.", 0) != 0) {
      EXPECT_TRUE(bit_equal(w, m2.at(name))) << name << " is frozen under LoRA but changed";
    }
    if (lora && name.find(".lora_B.") != std::string::npos) {
      EXPECT_FALSE(bit_equal(w, m2.at(name))) << name << " did not train";
    }
  }
  EXPECT_GT(adapters, 0);
  EXPECT_FALSE(bit_equal(m4.at("mod_router.weight"), m2.at("mod_router.weight"))) << "the router trains";
  EXPECT_EQ(flat_optimizer(ckpt(u, 4), "master").numel(), trainable)
      << "optimizer state of the trained tensors only";
}

// `gmod export` of a LoRA run: the base (no adapter tensors) and PEFT's adapter in <out>/adapter; `gmod
// merge` of the two writes a dir that gmod loads.
TEST(TrainLoraE2E, ExportWritesPeftAdapterAndMergeReadsIt) {
  TempDir t;
  const std::string u = t.str("run");
  const json targets{{"lora", {{"targets", json::array({"q_proj", "v_proj"})}}}};
  ASSERT_EQ(gmod_train(0, write_config(u, targets), {"lora.r=4", "lora.alpha=8", "schedule.max_steps=2"}), 0)
      << slurp(u + ".config.json.log");
  const std::string out = t.str("export"), merged = t.str("merged");
  ASSERT_EQ(run_shell(std::string(GMOD_BIN) + " export --checkpoint " + u + " --out " + out + " > " + out +
                      ".log 2>&1"),
            0)
      << slurp(out + ".log");
  gmod::SafetensorsFile a(out + "/adapter/adapter_model.safetensors");
  EXPECT_TRUE(a.has("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_FALSE(a.has("base_model.model.model.language_model.layers.0.self_attn.k_proj.lora_A.weight"));
  EXPECT_TRUE(std::filesystem::exists(out + "/adapter/adapter_config.json"));
  gmod::SafetensorsCheckpoint base(out);
  for (const auto& n : base.names()) EXPECT_EQ(n.find("lora_"), std::string::npos) << n;
  ASSERT_EQ(run_shell(std::string(GMOD_BIN) + " merge --model " + out + " --adapter " + out +
                      "/adapter --out " + merged + " > " + merged + ".log 2>&1"),
            0)
      << slurp(merged + ".log");
  EXPECT_NE(slurp(merged + ".log").find("linear layers merged"), std::string::npos);
  gmod::SafetensorsCheckpoint mm(merged);
  const std::string q = "language_model.model.layers.0.self_attn.q_proj.weight";
  ASSERT_TRUE(mm.has(q) && base.has(q));
  EXPECT_FALSE(at::equal(mm.tensor(q), base.tensor(q))) << "the trained adapter is merged into q_proj";
  const std::string k = "language_model.model.layers.0.self_attn.k_proj.weight";
  EXPECT_TRUE(at::equal(mm.tensor(k), base.tensor(k))) << "k_proj has no adapter";
}

}  // namespace

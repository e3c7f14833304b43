// RunPlan (trainer/run_plan.h): read -> validate -> resolve once; what it resolves, and that a bad file's message is
// read_valid_train_config's, naming the file and every key.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/common/error_of.h"
#include "tests/common/paths.h"
#include "trainer/model_setup.h"
#include "trainer/plan/memory_plan.h"
#include "trainer/run_plan.h"

using gmod::test::invalid_argument_of;

namespace gmod {
namespace {

TrainConfig valid_config() {
  TrainConfig c;
  c.model.path = test::fixture("hf/llava_layer_m2");
  c.data.train = test::fixture("conversation/cases.json");
  c.data.tokenizer = test::fixture("tokenizer/sp/tokenizer.model");
  c.data.max_len = 128;  // the fixture's max_position_embeddings
  return c;
}

TEST(RunPlan, ResolvesBatchDtypesAndTheStrategySettings) {
  TrainConfig c = valid_config();
  c.model.dtype = "bf16";
  c.batch.global_batch = 12;
  c.batch.micro_batch = 2;
  c.optimizer.zero_stage = 3;
  c.optimizer.zero3_prefetch = 2;
  c.optimizer.zero3_reshard_after_forward = false;
  c.optimizer.reduce_dtype = "param";  // = model.dtype
  c.optimizer.bucket_mb = 3;
  c.optimizer.offload = "cpu";
  c.optimizer.max_grad_norm = 0.5;
  c.model.activation_checkpointing = "every_2";
  c.metrics.profile_steps = "3-4";
  const RunPlan p = resolve_run_plan(c, 3);
  EXPECT_EQ(p.world, 3);
  EXPECT_EQ(p.dtype, at::kBFloat16);
  EXPECT_EQ(p.grad_accum, 2);  // 12 / (3 ranks x 2)
  EXPECT_EQ(p.global_batch, 12);
  EXPECT_EQ(p.data_parallel.zero_stage, 3);
  EXPECT_EQ(p.data_parallel.zero3_prefetch, 2);
  EXPECT_FALSE(p.data_parallel.zero3_reshard_after_forward);
  EXPECT_EQ(p.data_parallel.options.reduce_dtype, at::kBFloat16);
  EXPECT_EQ(p.data_parallel.options.bucket_bytes, int64_t(3) << 20);
  EXPECT_TRUE(p.data_parallel.options.offload);
  EXPECT_EQ(p.data_parallel.options.max_grad_norm, 0.5);
  EXPECT_TRUE(p.data_parallel.options.decay.empty());  // from the model, once its parameters are known
  EXPECT_EQ(p.checkpointing.every, 2);
  EXPECT_EQ(p.profile_steps.first, 3);
  EXPECT_EQ(p.profile_steps.last, 4);
  EXPECT_EQ(to_json(p.config), to_json(c));

  // `gmod plan` reads the same resolution.
  const MemoryPlanInputs in = plan_inputs_from_plan(p, run_model_config(c.model));
  EXPECT_EQ(in.grad_accum, 2);
  EXPECT_EQ(in.stage, 3);
  EXPECT_EQ(in.zero3_prefetch, 2);
  EXPECT_EQ(in.checkpointing, "every_k");
  EXPECT_EQ(in.checkpoint_every, 2);
}

TEST(RunPlan, ReadValidatesOnceWithTheFilesMessage) {
  test::TempDir dir;
  nlohmann::json j = to_json(valid_config());
  j["optimizer"]["lr"] = -1;
  j["optimizr"] = nlohmann::json::object();
  std::ofstream(dir.str("c.json")) << j.dump();
  const std::string msg = invalid_argument_of([&] { read_run_plan(dir.str("c.json"), {}, 1); });
  EXPECT_NE(msg.find(dir.str("c.json") + ": invalid training config, 3 problem(s):"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizr: unknown key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.lr: must be > 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.min_lr: must be in [0, lr]"), std::string::npos) << msg;

  std::ofstream(dir.str("ok.json")) << to_json(valid_config()).dump();
  const RunPlan p = read_run_plan(dir.str("ok.json"), {"batch.micro_batch=2", "batch.grad_accum=3"}, 2);
  EXPECT_EQ(p.config.batch.micro_batch, 2);
  EXPECT_EQ(p.grad_accum, 3);
  EXPECT_EQ(p.global_batch, 12);  // 3 x 2 ranks x 2
  // Checked for the job's world size: a global batch that does not split over the ranks is refused there.
  const std::string split =
      invalid_argument_of([&] { read_run_plan(dir.str("ok.json"), {"batch.global_batch=6"}, 4); });
  EXPECT_NE(split.find("not a multiple of world size (4)"), std::string::npos) << split;
}

}  // namespace
}  // namespace gmod

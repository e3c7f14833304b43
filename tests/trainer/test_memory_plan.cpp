// The memory plan's bookkeeping: parameter counts equal the built model's (dense, γ-MoD, per-layer routers),
// the optimizer and gradient terms follow the ZeRO stage and world size, the fits verdict uses budget and
// reserve, config keys the plan reads from the JSON are honoured, and bad inputs are rejected by name. (The
// byte terms are validated against measured peaks in mpi_memory_plan_test.cpp.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mod/conversion.h"
#include "mod/pmod.h"
#include "model/llava.h"
#include "tests/common/paths.h"
#include "tests/trainer/memory_plan_util.h"
#include "trainer/plan/memory_plan.h"
#include "trainer/config/train_config.h"

using namespace gmod;

namespace {

int64_t built_params(const LlavaConfig& c, const std::vector<int>& mods, RouterKind router) {
  MultimodalLM m(c);
  if (!mods.empty()) {
    MoDConfig mc;
    mc.mod_layers = mods;
    mc.router = router;
    convert_to_mod(m, mc);
  }
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace

TEST(MemoryPlan, ParamCountsMatchTheBuiltModel) {
  LlavaConfig c = gmod::testing::small_llava_config();
  EXPECT_EQ(count_params(c, {}, "gamma_shared").total(), built_params(c, {}, RouterKind::kGammaShared));
  EXPECT_EQ(count_params(c, {1, 3}, "gamma_shared").total(),
            built_params(c, {1, 3}, RouterKind::kGammaShared));
  EXPECT_EQ(count_params(c, {1, 3}, "per_layer").total(), built_params(c, {1, 3}, RouterKind::kPerLayer));
  c.text.num_key_value_heads = 2;  // GQA
  c.text.tie_word_embeddings = true;
  c.text.attention_bias = true;
  EXPECT_EQ(count_params(c, {}, "gamma_shared").total(), built_params(c, {}, RouterKind::kGammaShared));
  c.vision->model_type = "siglip_vision_model";  // SigLIP: conv bias, no class token, no pre-layernorm
  c.vision->hidden_act = "gelu_pytorch_tanh";
  EXPECT_EQ(count_params(c, {}, "gamma_shared").total(), built_params(c, {}, RouterKind::kGammaShared));
}

// p-MoD (mod.rule pmod): its routers (weight [1, D] + bias per MoD layer) are counted, its layers come from the
// schedule, each planned at its own kept share of the tokens (image tokens decay with depth, text tokens stay), so
// the activations lie between plans where every MoD layer keeps the first MoD layer's share and the deepest one's.
TEST(MemoryPlan, PModLayersArePlannedAtTheirScheduleRatios) {
  const LlavaConfig c = gmod::testing::small_llava_config();
  const MoDConfig pm = pmod_config(c.text.num_hidden_layers);
  MultimodalLM built(c);
  convert_to_mod(built, pm);
  int64_t n = 0;
  for (const auto& p : built.parameters()) n += p.numel();
  EXPECT_EQ(count_params(c, pm.mod_layers, "pmod").total(), n);

  TrainConfig cfg;
  cfg.mod.enabled = true;
  cfg.mod.rule = "pmod";
  const MemoryPlanInputs in = plan_inputs_from_config(cfg, c, 2);
  EXPECT_EQ(in.mod_router, "pmod");
  EXPECT_EQ(in.mod_layers, pm.mod_layers);
  ASSERT_EQ(in.mod_kept_by_layer.size(), pm.mod_layers.size());
  for (size_t i = 1; i < in.mod_kept_by_layer.size(); ++i)
    EXPECT_LE(in.mod_kept_by_layer[i], in.mod_kept_by_layer[i - 1]) << "layer " << pm.mod_layers[i];
  EXPECT_LT(in.mod_kept_by_layer.back(), 1.0);
  EXPECT_EQ(in.mod_kept_fraction, in.mod_kept_by_layer.front());

  MemoryPlanInputs p = gmod::testing::small_plan_inputs(2, 1);
  p.mod_layers = in.mod_layers;
  p.mod_router = "pmod";
  p.mod_kept_by_layer = in.mod_kept_by_layer;
  p.mod_kept_fraction = in.mod_kept_fraction;
  MemoryPlanInputs highest = p, lowest = p;
  highest.mod_kept_by_layer.assign(p.mod_layers.size(), p.mod_kept_by_layer.front());
  lowest.mod_kept_by_layer.assign(p.mod_layers.size(), p.mod_kept_by_layer.back());
  const MemoryPlan mp = plan_memory(p), mh = plan_memory(highest), ml = plan_memory(lowest);
  EXPECT_LT(mp.activations_saved, mh.activations_saved);
  EXPECT_GT(mp.activations_saved, ml.activations_saved);
  MemoryPlanInputs bad = p;
  bad.mod_kept_by_layer.pop_back();
  EXPECT_THROW(plan_memory(bad), std::invalid_argument);
  cfg.mod.rule = "pmod:official_31";  // the original's denominator on a 4-layer LLM: every ratio >= 0.85, no layer
  EXPECT_THROW(plan_inputs_from_config(cfg, c, 2), std::invalid_argument);
}

TEST(MemoryPlan, LlavaOneFiveSevenBHasItsPublishedSize) {
  LlavaConfig c = load_model_config(gmod::test::source_dir() + "/configs/llava15_7b");
  EXPECT_EQ(count_params(c, {}, "gamma_shared").total(), 7063427072);  // llava-hf/llava-1.5-7b-hf
}

TEST(MemoryPlan, StateTermsFollowStageAndWorld) {
  for (int world : {1, 2, 3})
    for (int stage : {0, 1, 2}) {
      MemoryPlanInputs in = gmod::testing::small_plan_inputs(world, stage);
      const MemoryPlan p = plan_memory(in);
      const int64_t padded = (p.params_trainable + world - 1) / world * world;
      EXPECT_EQ(p.params_padded, padded);
      const int64_t local = stage == 0 ? p.params_trainable : padded / world;
      const MemoryPhase* step = nullptr;
      for (const auto& ph : p.phases)
        if (ph.name == "optimizer step") step = &ph;
      ASSERT_NE(step, nullptr);
      // optimizer step phase = static terms + AdamW temporaries; static optimizer state is 12 B per owned
      // element
      EXPECT_EQ(p.term_bytes("optimizer_states"), 12 * local) << "world " << world << " stage " << stage;
      // ZeRO-2 counts its gradient buckets per phase: all of them at the end of the backward, none in step().
      EXPECT_EQ(p.term_bytes("gradients"), stage == 2 ? 0 : 4 * padded);
      auto phase_term = [](const MemoryPhase& ph, const std::string& name) {
        int64_t b = 0;
        for (const auto& t : ph.terms) b += t.name == name ? t.bytes : 0;
        return b;
      };
      for (const auto& ph : p.phases) {
        if (ph.name == "end of backward") {
          EXPECT_EQ(phase_term(ph, "gradients_zero2"), stage == 2 ? 4 * padded : 0);
        }
      }
      EXPECT_EQ(phase_term(*step, "gradients_zero2"), 0);
      EXPECT_EQ(p.term_bytes("reduced_grad_shard"), stage == 2 ? 4 * local : 0);
      EXPECT_EQ(p.comm.size(), stage == 0 ? 1u : 2u);
    }
}

TEST(MemoryPlan, CheckpointingShrinksActivations) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  const MemoryPlan none = plan_memory(in);
  in.checkpointing = "full";
  const MemoryPlan full = plan_memory(in);
  in.checkpointing = "every_k";
  in.checkpoint_every = 2;
  const MemoryPlan half = plan_memory(in);
  EXPECT_EQ(none.activations_saved, full.activations_saved);  // reported without checkpointing
  EXPECT_LT(full.total, half.total);
  EXPECT_LT(half.total, none.total);
}

TEST(MemoryPlan, FitsUsesBudgetAndReserve) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  const int64_t total = plan_memory(in).total;
  in.budget_bytes = double(total) + 100;
  EXPECT_TRUE(plan_memory(in).fits);
  in.reserve_bytes = 101;
  EXPECT_FALSE(plan_memory(in).fits);
}

// Checkpointing, ZeRO-3's prefetch and reshard, and the reduction keys from the parsed TrainConfig ("param" =
// model dtype), as gmod train reads them.
TEST(MemoryPlan, ReadsCheckpointingAndReductionKeys) {
  TrainConfig cfg;
  cfg.model.activation_checkpointing = "full";
  cfg.model.dtype = "bf16";
  cfg.optimizer.accumulate_fp32 = true;
  cfg.optimizer.reduce_dtype = "param";
  cfg.optimizer.zero3_prefetch = 3;
  cfg.optimizer.zero3_reshard_after_forward = false;
  cfg.mod.enabled = true;
  cfg.mod.rule = "keep_top:1";
  const MemoryPlanInputs in = plan_inputs_from_config(cfg, gmod::testing::small_llava_config(), 2);
  EXPECT_EQ(in.checkpointing, "full");
  EXPECT_TRUE(in.accumulate_fp32);
  EXPECT_EQ(in.reduce_dtype, "bf16");
  EXPECT_EQ(in.zero3_prefetch, 3);
  EXPECT_FALSE(in.zero3_reshard_after_forward);
  EXPECT_EQ(in.mod_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_LT(in.mod_kept_fraction, 1.0);
  EXPECT_EQ(plan_inputs_from_config(TrainConfig{}, gmod::testing::small_llava_config(), 2).zero3_prefetch,
            TrainConfig{}.optimizer.zero3_prefetch);
}

TEST(MemoryPlan, ReadsTheTrainersActivationCheckpointingSpelling) {
  TrainConfig cfg;
  cfg.model.activation_checkpointing = "every_3";  // as gmod train takes it (model/activation_checkpoint.h)
  MemoryPlanInputs in = plan_inputs_from_config(cfg, gmod::testing::small_llava_config(), 1);
  EXPECT_EQ(in.checkpointing, "every_k");
  EXPECT_EQ(in.checkpoint_every, 3);
  cfg.model.activation_checkpointing = "every_1";
  EXPECT_EQ(plan_inputs_from_config(cfg, gmod::testing::small_llava_config(), 1).checkpointing, "full");
  EXPECT_EQ(plan_inputs_from_config(TrainConfig{}, gmod::testing::small_llava_config(), 1).checkpointing,
            "none");
}

TEST(MemoryPlan, RejectsBadInputsByName) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.checkpointing = "sometimes";
  EXPECT_THROW(
      {
        try {
          plan_memory(in);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("checkpointing"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  in = gmod::testing::small_plan_inputs(1, 4);
  EXPECT_THROW(plan_memory(in), std::invalid_argument);
  in = gmod::testing::small_plan_inputs(1, 1, "fp8");
  EXPECT_THROW(plan_memory(in), std::invalid_argument);
}

// Optimizer offload: the 12 B/param state leaves the device total for host_terms (CUDA adds the host copy of the
// fp32 gradient shard and of the bf16 parameter shard), and nothing else changes but AdamW's temporaries.
TEST(MemoryPlan, OffloadMovesTheStateToHost) {
  for (int stage : {0, 1, 2, 3})
    for (const char* dev : {"cpu", "cuda"}) {
      MemoryPlanInputs in = gmod::testing::small_plan_inputs(2, stage, "bf16");
      in.device = dev;
      const MemoryPlan on_dev = plan_memory(in);
      in.offload = "cpu";
      const MemoryPlan off = plan_memory(in);
      const int64_t local = stage == 0 ? off.params_trainable : off.params_padded / 2;
      const std::string what = std::string("stage ") + std::to_string(stage) + " " + dev;
      EXPECT_EQ(off.term_bytes("optimizer_states"), 0) << what;
      EXPECT_EQ(on_dev.host_total, 0) << what;
      EXPECT_EQ(off.host_total, 12 * local + (in.device == "cuda" ? (4 + 2) * local : 0)) << what;
      int64_t step_dev = 0, step_off = 0;
      for (const auto& ph : on_dev.phases)
        if (ph.name == "optimizer step") step_dev = ph.bytes;
      for (const auto& ph : off.phases)
        if (ph.name == "optimizer step") step_off = ph.bytes;
      EXPECT_EQ(step_dev - step_off, 12 * local + 8 * local) << what;  // the state and the denominator chunk
    }
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.offload = "nvme";
  EXPECT_THROW(plan_memory(in), std::invalid_argument);
}

// checkpoint.async: the host copy of what each rank writes (about 1/N of the weights in their dtype + its 12 B/param
// optimizer shard) is a host term; the device side does not change.
TEST(MemoryPlan, AsyncCheckpointAddsTheHostSnapshot) {
  for (int world : {1, 2, 3})
    for (int stage : {0, 1, 2}) {
      MemoryPlanInputs in = gmod::testing::small_plan_inputs(world, stage, "bf16");
      const MemoryPlan sync = plan_memory(in);
      in.async_checkpoint = true;
      const MemoryPlan async = plan_memory(in);
      const int64_t local = stage == 0 ? async.params_trainable : async.params_padded / world;
      const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage);
      EXPECT_EQ(async.total, sync.total) << what;
      EXPECT_EQ(async.host_total - sync.host_total, (2 * async.params_total + world - 1) / world + 12 * local)
          << what;
      EXPECT_NE(format_plan(async).find("checkpoint_snapshot"), std::string::npos) << what;
    }
}

// ZeRO-3 against a hand count of the small model's units (LLM 4 layers x 128, vocab 1024, untied; frozen CLIP)
// as parallel/zero3_driver.h forms them: 4 hooked decoder layers; embeddings, projector, final norm and LM head
// persistent. The parameter shard is the only static parameter storage; the persistent units are gathered in
// every phase but the optimizer step, prefetch + 1 layers in a layer's backward (all 4 without reshard after
// forward, also at the loss); communication per step: a forward gather of every parameter, a backward gather of
// the layers (none without reshard), one reduce-scatter.
namespace {
int64_t phase_term(const MemoryPlan& p, const std::string& phase, const std::string& term) {
  for (const auto& ph : p.phases)
    if (ph.name == phase)
      for (const auto& t : ph.terms)
        if (t.name == term) return t.bytes;
  return -1;  // absent
}
}  // namespace

// gmod plan states how far CUDA reserved memory may exceed the total when reductions lag the backward: what is
// freed at enqueue (stage-2 buckets, ZeRO-3 unit gradients, reduce-dtype copies) may all stay reserved; nothing on
// the CPU (MPI frees at completion) and only the copies at stages 0/1 (their buckets are one flat buffer).
TEST(MemoryPlan, StatesTheReservedBoundWhenReductionsLag) {
  for (int stage : {0, 1, 2, 3})
    for (const char* reduce : {"fp32", "bf16"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " reduce " + reduce);
      MemoryPlanInputs in = gmod::testing::small_plan_inputs(2, stage, "bf16");
      in.reduce_dtype = reduce;
      EXPECT_EQ(plan_memory(in).cuda_reserved_lag_bytes, 0);
      in.device = "cuda";
      const MemoryPlan p = plan_memory(in);
      const int64_t n = stage == 3 ? p.params_trainable : p.params_padded;
      const int64_t copy = std::string(reduce) == "fp32" ? 4 : 0;  // bf16 gradients reduced in fp32
      EXPECT_EQ(p.cuda_reserved_lag_bytes, (stage >= 2 ? 2 * n : 0) + copy * n);
      EXPECT_EQ(format_plan(p).find("CUDA reserved may exceed the total by up to") != std::string::npos,
                p.cuda_reserved_lag_bytes > 0);
    }
}

TEST(MemoryPlan, Zero3TermsFromTheUnits) {
  const LlavaConfig c = gmod::testing::small_llava_config();
  const int64_t D = 128, I = 344, V = 1024, Dv = 64;
  const int64_t layer = 4 * D * D + 3 * D * I + 2 * D, embed = V * D, head = V * D + D;
  const int64_t projector = Dv * D + D + D * D + D;
  const int64_t trainable = 4 * layer + embed + head + projector, persistent = embed + head + projector;
  for (int world : {1, 2, 3})
    for (int prefetch : {0, 1, 2})
      for (bool reshard : {true, false}) {
        SCOPED_TRACE("world " + std::to_string(world) + " prefetch " + std::to_string(prefetch) +
                     (reshard ? "" : " no reshard"));
        MemoryPlanInputs in = gmod::testing::small_plan_inputs(world, 3, "bf16");
        in.reduce_dtype = "bf16";
        in.zero3_prefetch = prefetch;
        in.zero3_reshard_after_forward = reshard;
        const MemoryPlan p = plan_memory(in);
        const int64_t S = p.params_padded / world;
        EXPECT_EQ(p.params_trainable, trainable);
        EXPECT_EQ(p.zero3_unit_params, layer);
        EXPECT_EQ(p.zero3_persistent_params, persistent);
        EXPECT_EQ(p.term_bytes("weights"), 2 * S);
        EXPECT_EQ(p.term_bytes("gradients"), 0);
        EXPECT_EQ(p.term_bytes("optimizer_states"), 12 * S);
        EXPECT_EQ(phase_term(p, "forward (loss)", "weights_gathered"), 2 * (persistent + (reshard ? 0 : 4 * layer)));
        EXPECT_EQ(phase_term(p, "layer backward", "weights_gathered"),
                  2 * (persistent + (reshard ? (prefetch + 1) * layer : 4 * layer)));
        EXPECT_EQ(phase_term(p, "end of backward", "weights_gathered"), 2 * persistent);
        EXPECT_EQ(phase_term(p, "optimizer step", "weights_gathered"), -1);
        // The persistent units' gradients from the end of the forward; the running layer's in its backward.
        EXPECT_EQ(phase_term(p, "loss backward", "gradients_zero3"), 2 * persistent);
        EXPECT_EQ(phase_term(p, "layer backward", "gradients_zero3"), 2 * (persistent + layer));
        // At the end of the backward the first layer's reduction has not started yet (it starts there).
        EXPECT_EQ(phase_term(p, "end of backward", "gradients_zero3"), 2 * (persistent + layer));
        const int64_t payload = 2 * trainable + (reshard ? 2 * 4 * layer : 0) + 2 * trainable;
        EXPECT_EQ(p.comm_payload_bytes, payload);
        EXPECT_DOUBLE_EQ(p.comm_wire_bytes, world > 1 ? double(payload) * (world - 1) / world : 0.0);
      }
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(2, 3);
  in.model.text.tie_word_embeddings = true;  // one tensor for both: persistent, counted once
  const MemoryPlan tied = plan_memory(in);
  EXPECT_EQ(tied.zero3_persistent_params, embed + D + projector);
  EXPECT_EQ(phase_term(tied, "layer backward", "weights_gathered"), 4 * (embed + D + projector + 2 * layer));
  // γ-MoD's shared router (used by every MoD layer) is persistent too.
  in = gmod::testing::small_plan_inputs(2, 3);
  in.mod_layers = {1, 2};
  EXPECT_EQ(plan_memory(in).zero3_persistent_params, persistent + 2 * D);
  in.stage = 4;
  EXPECT_THROW(plan_memory(in), std::invalid_argument);
}

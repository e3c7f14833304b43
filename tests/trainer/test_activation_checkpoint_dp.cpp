// Activation checkpointing with the data-parallel optimizer's overlapped bucket reduction (single process,
// LocalComm, γ-MoD model): each parameter receives exactly one gradient per backward (a second one would
// throw in the post-accumulate-grad hook), every bucket is launched during the backward, and a few
// accumulated optimizer steps end bitwise where the non-checkpointed, non-overlapped run ends. The multi-rank
// counterpart is TrainE2E.ActivationCheckpointingTwoRanks.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "model/activation_checkpoint.h"
#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

constexpr int kMicro = 2;

MoDConfig mod_config() {
  MoDConfig c;
  c.mod_layers = {1, 2, 3};
  c.router_aux_loss_coef = 0.5;
  return c;
}

struct Trained {
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<double> grad_norms;
};

Trained train(const std::string& ckpt, bool overlap, int stage) {
  const MoDConfig cfg = mod_config();
  auto m = test::random_text_lm(4, 21);
  convert_to_mod(*m, cfg);
  m->train();
  m->llm->activation_checkpointing = parse_activation_checkpointing(ckpt);
  DataParallelOptimizer::NamedParams params;
  for (const auto& p : m->named_parameters()) params.emplace_back(p.key(), p.value());
  DataParallelOptions o;
  o.stage = stage;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  o.max_grad_norm = 1.0;
  o.bucket_bytes = 8 << 10;  // several buckets
  o.overlap_comm = overlap;
  DataParallelOptimizer opt(params, std::make_shared<LocalComm>(), o);
  EXPECT_GT(opt.buckets().size(), 3u);

  Trained t;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    for (int k = 0; k < kMicro; ++k) {
      auto in = test::text_inputs({20, 15}, 20, 12, 100 + 10 * step + k);
      in.labels = in.input_ids.masked_fill(in.attention_mask.logical_not(), -100);
      ForwardState st;
      ModelOutput out = m->forward(in, st);
      at::Tensor loss = (out.lm_loss + total_routing_loss(st, cfg)) / double(kMicro);
      if (k == kMicro - 1) opt.set_last_micro_batch();
      EXPECT_NO_THROW(loss.backward()) << ckpt << " step " << step;
    }
    if (overlap) {
      EXPECT_EQ(opt.buckets_launched_early(), int(opt.buckets().size()))
          << ckpt << " step " << step << ": every bucket should start during the backward";
    }
    t.grad_norms.push_back(opt.step().grad_norm);
  }
  for (const auto& p : m->named_parameters()) t.params.emplace_back(p.key(), p.value().detach().clone());
  return t;
}

}  // namespace

TEST(ActivationCheckpointingDataParallel, OverlappedReductionGivesBitwiseTheSameWeights) {
  for (int stage : {0, 2}) {
    const Trained ref = train("none", /*overlap=*/false, stage);
    for (const char* ckpt : {"full", "every_2"}) {
      const Trained got = train(ckpt, /*overlap=*/true, stage);
      const std::string what = std::string(ckpt) + ", ZeRO-" + std::to_string(stage);
      EXPECT_EQ(ref.grad_norms, got.grad_norms) << what;
      ASSERT_EQ(ref.params.size(), got.params.size());
      for (size_t i = 0; i < ref.params.size(); ++i)
        EXPECT_TRUE(at::equal(ref.params[i].second, got.params[i].second))
            << what << ": " << ref.params[i].first << " differs after 3 steps";
    }
  }
}

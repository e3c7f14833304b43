// Peak memory of one forward + backward with the full-logits loss (MultimodalLM::forward) and with the
// label-only chunked loss (model/lm_loss.h, what training uses), counted by MemoryTracker (every CPU tensor
// byte). A vocabulary-heavy model, 30% of the positions labelled as in a LLaVA conversation: the label-only
// path must save at least three fp32 [B, L, V] tensors' worth (today's path holds the logits, the log_softmax
// output and their gradients), and with several chunks its loss transient must stay near one chunk.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "model/lm_loss.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

namespace {

constexpr int64_t kB = 4, kL = 128, kV = 8192;

LlavaConfig vocab_heavy() {
  LlavaConfig c;
  c.text.vocab_size = kV;
  c.text.hidden_size = 64;
  c.text.intermediate_size = 128;
  c.text.num_hidden_layers = 1;
  c.text.num_attention_heads = 4;
  c.text.num_key_value_heads = 4;
  return c;
}

ModelInputs batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  ModelInputs in;
  in.input_ids = at::randint(3, kV, {kB, kL}, gen, at::kLong);
  in.labels = in.input_ids.clone();
  in.labels.narrow(1, 0, kL - int64_t(0.3 * (kL - 1))).fill_(-100);
  return in;
}

// Peak live bytes above what existed before the forward (weights, inputs) of forward + backward.
int64_t peak(MultimodalLM& m, const ModelInputs& in, int64_t chunk) {
  MemoryTracker& t = MemoryTracker::install();
  m.zero_grad();
  for (auto& p : m.parameters()) p.mutable_grad() = at::zeros_like(p);  // as the optimizer's gradient buffers
  const int64_t base = t.live_bytes();
  t.reset_peak();
  {
    ForwardState st;
    ModelOutput out = chunk < 0 ? m.forward(in, st) : forward_label_loss(m, in, st, chunk);
    out.lm_loss_sum.backward();
  }
  return t.peak_bytes() - base;
}

}  // namespace

TEST(LabelOnlyLossMemory, PeakDropsByTheFullLogitsTensors) {
  MemoryTracker::install();
  auto m = std::make_shared<MultimodalLM>(vocab_heavy());
  m->init_weights(1);
  m->train();
  const ModelInputs in = batch();
  const int64_t full = peak(*m, in, -1);
  const int64_t label_only = peak(*m, in, 0);
  const int64_t chunked = peak(*m, in, 16);
  const int64_t blv = 4 * kB * kL * kV;  // one fp32 [B, L, V]
  std::printf(
      "forward+backward peak above weights: full logits %.2f MiB, label-only %.2f MiB, label-only in "
      "chunks of 16 rows %.2f MiB (one fp32 [B,L,V] = %.2f MiB)\n",
      full / 1048576.0, label_only / 1048576.0, chunked / 1048576.0, blv / 1048576.0);
  EXPECT_LT(label_only, full - 3 * blv);
  EXPECT_LT(chunked, label_only);
  // With chunks of 16 rows what remains is the decoder's part plus a [V, D] weight gradient: well under one
  // [B, L, V] tensor.
  EXPECT_LT(chunked, blv);
}

// Zero3Driver's collectives (parallel/zero3_driver.h) are issued in the same sequence on every rank, whatever
// each rank's data: the property a single NCCL communicator needs, since it runs its ops in issue order
// whatever their stream (gathers on its gather stream, reductions on the reduction stream). Rank 0's
// micro-batches carry images, the other ranks' are text-only, so only rank 0 runs the (trainable) CLIP
// layers' forward and backward and its autograd reaches the units in a different pattern; a recording Comm
// over the real MpiComm (and over the duplicate the reductions use on MPI) logs every collective start on one
// list per rank, and the lists must be equal on all ranks: at prefetch 0, 1 and 2, with and without reshard
// after forward, with and without activation checkpointing, with gradient accumulation. Run at 1, 2 and 3
// ranks (ctest mpi_zero3_order*).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/activation_checkpoint.h"
#include "model/lm_loss.h"
#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"
#include "tests/trainer/memory_plan_util.h"
#include "parallel/zero3_driver.h"

using namespace gmod;

namespace {

using Log = std::vector<std::string>;

// Forwards every collective to `inner` and appends "<op> <numel>" to a log shared with its duplicates.
class RecordingComm final : public Comm {
 public:
  RecordingComm(std::shared_ptr<Comm> inner, std::shared_ptr<Log> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  at::Device device() const override { return inner_->device(); }
  std::string backend() const override { return "recording " + inner_->backend(); }
  using Comm::all_reduce;
  void all_reduce(at::Tensor& t, ReduceOp op) override { note("all_reduce", t), inner_->all_reduce(t, op); }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    note("reduce_scatter", in), inner_->reduce_scatter(in, out, op);
  }
  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    note("all_gather", out), inner_->all_gather(in, out);
  }
  void broadcast(at::Tensor& t, int root) override { note("broadcast", t), inner_->broadcast(t, root); }
  void barrier() override { log_->push_back("barrier"), inner_->barrier(); }
  std::unique_ptr<CommRequest> all_reduce_start(at::Tensor t, ReduceOp op) override {
    note("all_reduce_start", t);
    return inner_->all_reduce_start(t, op);
  }
  std::unique_ptr<CommRequest> reduce_scatter_v_start(at::Tensor in, at::Tensor out,
                                                      std::vector<int64_t> counts, ReduceOp op) override {
    note("reduce_scatter_v_start", in);
    return inner_->reduce_scatter_v_start(in, out, std::move(counts), op);
  }
  std::unique_ptr<CommRequest> all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) override {
    note("all_gather_v_start", buf);
    return inner_->all_gather_v_start(buf, std::move(counts));
  }
  std::shared_ptr<Comm> duplicate() const override {
    return std::make_shared<RecordingComm>(inner_->duplicate(), log_);
  }

 private:
  void note(const char* op, const at::Tensor& t) {
    log_->push_back(std::string(op) + " " + std::to_string(t.numel()));
  }
  std::shared_ptr<Comm> inner_;
  std::shared_ptr<Log> log_;
};

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

// [BOS, image tokens (with_image), text], 30% of the positions labelled.
ModelInputs batch(const LlavaConfig& c, int B, int L, bool with_image, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  ModelInputs in;
  at::Tensor ids = at::randint(3, c.text.vocab_size - 30, {B, L}, gen, lopt);
  ids.select(1, 0).fill_(c.text.bos_token_id);
  const int64_t T = with_image ? c.image_seq_length() : 0;
  if (T > 0) {
    ids.narrow(1, 1, T).fill_(c.image_token_id);
    const int S = c.image_input_size();
    in.pixel_values = at::randn({B, 3, S, S}, gen, at::TensorOptions().dtype(at::kFloat));
  }
  in.input_ids = ids;
  in.labels = ids.clone();
  in.labels.narrow(1, 0, L - L * 3 / 10).fill_(-100);
  in.attention_mask = at::ones({B, L}, at::TensorOptions().dtype(at::kBool));
  return in;
}

constexpr int kSteps = 2, kMicro = 2;  // optimizer steps, micro-batches per step

struct Run {
  Log log;
  int units = 0, hooked = 0;  // Zero3Driver::num_units(), num_hooked_units()
};

// The collective log of two optimizer steps (accumulation 2) of a small LLaVA with trainable CLIP layers.
Run run(int prefetch, bool reshard, bool checkpointing) {
  LlavaConfig c = gmod::testing::small_llava_config();
  auto model = std::make_shared<MultimodalLM>(c);
  model->init_weights(7);
  model->train();
  model->llm->activation_checkpointing = parse_activation_checkpointing(checkpointing ? "full" : "none");
  model->vision->set_activation_checkpointing(checkpointing);
  Zero3Driver::NamedParams trainable;
  for (auto& item : model->named_parameters()) trainable.emplace_back(item.key(), item.value());
  auto log = std::make_shared<Log>();
  auto comm = std::make_shared<RecordingComm>(world(), log);
  DataParallelOptions o;
  o.stage = 2;
  o.lr = 1e-3;
  Zero3Driver z3(hooked_units(*model), trainable, comm, o, prefetch, reshard);
  trainable.clear();
  EXPECT_GT(z3.num_hooked_units(), 4) << "the CLIP layers must be hooked units";
  const bool images = world()->rank() == 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < kMicro; ++k) {
      const ModelInputs in = batch(c, 2, 48, images, 100 * uint64_t(world()->rank()) + 10 * step + k);
      ForwardState st;
      z3.begin_forward();
      const ModelOutput out = forward_label_loss(*model, in, st);
      z3.end_forward();
      if (k + 1 == kMicro) z3.set_last_micro_batch();
      out.lm_loss_sum.backward();
      z3.end_backward();
    }
    at::Tensor stat = at::zeros({1}, at::kDouble);
    z3.all_reduce_after_gradients(stat);
    z3.step(1e-3);
  }
  return Run{*log, z3.num_units(), z3.num_hooked_units()};
}

void expect_same_on_every_rank(const Run& r, bool reshard, const std::string& what) {
  const Log& log = r.log;
  std::string all;
  for (const auto& e : log) all += e + ";";
  const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(all) >> 1);
  at::Tensor t = at::tensor({h, -h, int64_t(log.size()), -int64_t(log.size())}, at::kLong);
  world()->all_reduce(t, ReduceOp::Max);
  EXPECT_EQ(t[0].item<int64_t>(), h) << what << ": ranks issued different collective sequences (rank "
                                     << world()->rank() << ", " << log.size() << " collectives)";
  EXPECT_EQ(-t[1].item<int64_t>(), h) << what;
  EXPECT_EQ(t[2].item<int64_t>(), -t[3].item<int64_t>()) << what << ": different numbers of collectives";
  // Exactly the collectives of the design (the same on every rank, so equality alone would not see an extra
  // or missing one): per micro-batch one gather of every unit for the forward and, with reshard after
  // forward, one more of every hooked unit for the backward (none without: the units stay gathered); per step
  // one reduction of every unit.
  int gathers = 0, reductions = 0;
  for (const auto& e : log) {
    gathers += e.rfind("all_gather_v_start", 0) == 0;
    reductions += e.rfind("reduce_scatter_v_start", 0) == 0;
  }
  EXPECT_GT(r.hooked, 4) << what;
  EXPECT_GT(r.units, r.hooked) << what << ": persistent units (embeddings, head, projector)";
  EXPECT_EQ(gathers, kSteps * kMicro * (r.units + (reshard ? r.hooked : 0))) << what << ": unit gathers";
  EXPECT_EQ(reductions, kSteps * r.units) << what << ": gradient reductions";
}

}  // namespace

TEST(Zero3Order, SameCollectiveSequenceOnEveryRank) {
  // Ranks whose sequences differ can also wait on each other (one blocks on a gather the other issues only
  // after a reduction it is itself waiting for): a deadline well below ctest's turns such a wait into an
  // error naming the collective instead of a hang.
  set_collective_timeout(60);
  for (int prefetch : {0, 1, 2})
    for (bool reshard : {true, false})
      for (bool ckpt : {false, true}) {
        const std::string what = "prefetch " + std::to_string(prefetch) + (reshard ? "" : ", no reshard") +
                                 (ckpt ? ", checkpointing" : "");
        expect_same_on_every_rank(run(prefetch, reshard, ckpt), reshard, what);
      }
}

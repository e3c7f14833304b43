// Sequence packing (data/pack.h): first-fit-decreasing rows within the budget, every sample exactly once and whole,
// the packed micro-batch holds the unpacked one's tokens, labels, roles and images (in token order) with positions
// restarting per sample; a loader with pack_to gives the same samples per micro-batch as without, for any number of
// workers, and resumes at a position exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/demo_dataset.h"
#include "data/loader.h"
#include "data/pack.h"
#include "model/token_roles.h"
#include "tests/common/paths.h"
#include "tests/data/demo_config.h"

using namespace gmod;

namespace {

struct PackDemo {
  gmod::test::TempDir dir;
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"));
  PackDemo() {
    DemoDatasetOptions o;
    o.num_train = 40;
    o.num_heldout = 2;
    o.image_size = 32;
    make_demo_dataset(dir.str(), o);
  }
  DatasetConfig config() const { return gmod::test::demo_dataset_config(dir, "train.json"); }
};

LoaderConfig loader_config(int mb, int workers, int64_t pack_to) {
  LoaderConfig c;
  c.micro_batch_size = mb;
  c.sampler.seed = 5;
  c.sampler.global_batch_size = mb * 2;
  c.num_workers = workers;
  c.prefetch = 2;
  c.log_bad_records = false;
  c.pack_to = pack_to;
  return c;
}

// The unpacked batch's sample `s` (its valid prefix) against the packed batch's segment at (row, start).
void expect_same_sample(const Batch& unpacked, int64_t s, const Batch& packed, int64_t row, int64_t start,
                        int64_t len) {
  auto sl = [&](const at::Tensor& t, int64_t r, int64_t from) { return t[r].narrow(0, from, len); };
  EXPECT_TRUE(sl(unpacked.input_ids, s, 0).equal(sl(packed.input_ids, row, start)));
  EXPECT_TRUE(sl(unpacked.token_roles, s, 0).equal(sl(packed.token_roles, row, start)));
  EXPECT_TRUE(sl(packed.attention_mask, row, start).all().item<bool>());
  // Labels equal except the first, which packing always ignores (no token predicts the next sample's first).
  EXPECT_EQ(packed.labels[row][start].item<int64_t>(), -100);
  if (len > 1) {
    EXPECT_TRUE(unpacked.labels[s].narrow(0, 1, len - 1).equal(packed.labels[row].narrow(0, start + 1, len - 1)));
  }
  EXPECT_TRUE(packed.positions[row].narrow(0, start, len).equal(at::arange(len, at::kLong)));
}

}  // namespace

TEST(Packing, FirstFitDecreasingKeepsEverySampleOnceWithinTheBudget) {
  const std::vector<int64_t> lengths{700, 120, 1900, 64, 1024, 1500, 300, 2048, 90, 600, 1100, 33};
  const int64_t budget = 2048;
  const auto rows = pack_first_fit_decreasing(lengths, budget);
  std::vector<size_t> seen;
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t sum = 0;
    for (size_t i : r) sum += lengths[i], seen.push_back(i);
    EXPECT_LE(sum, budget);
    total += sum;
  }
  std::sort(seen.begin(), seen.end());
  std::vector<size_t> all(lengths.size());
  std::iota(all.begin(), all.end(), size_t(0));
  EXPECT_EQ(seen, all);
  // First fit decreasing: no sample would have fitted an earlier row when it was placed; the lower bound on rows.
  EXPECT_GE(static_cast<int64_t>(rows.size()), (total + budget - 1) / budget);
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i : rows[r])
      for (size_t e = 0; e < r; ++e) {
        int64_t before = 0;  // the earlier row's load when sample i was placed: its samples longer or tied earlier
        for (size_t j : rows[e])
          if (lengths[j] > lengths[i] || (lengths[j] == lengths[i] && j < i)) before += lengths[j];
        EXPECT_GT(before + lengths[i], budget) << "sample " << i << " fitted row " << e;
      }
  EXPECT_EQ(pack_first_fit_decreasing(lengths, budget), rows);  // deterministic
}

TEST(Packing, BadLengthsAndBudgetsAreNamedErrors) {
  try {
    pack_first_fit_decreasing({10, 2049, 5}, 2048);
    FAIL() << "a sample over the budget was packed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sample 1 has 2049 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pack_first_fit_decreasing({10, 0}, 64), std::invalid_argument);
  EXPECT_THROW(pack_first_fit_decreasing({10}, 0), std::invalid_argument);
  EXPECT_TRUE(pack_first_fit_decreasing({}, 64).empty());
}

TEST(Packing, PackedBatchHoldsTheUnpackedSamplesImagesInTokenOrder) {
  PackDemo demo;
  Dataset ds(demo.config(), demo.tok);
  std::vector<PreparedSample> a, b;
  for (size_t i = 0; i < 12; ++i) {
    a.push_back(ds.prepare(i));
    b.push_back(ds.prepare(i));
  }
  int64_t longest = 0;
  for (const auto& s : a) longest = std::max<int64_t>(longest, static_cast<int64_t>(s.sample.ids.size()));
  const Batch unpacked = collate(a, 0, 28);
  const Batch packed = collate_packed(b, 0, 28, 2 * longest);
  ASSERT_TRUE(packed.segments);
  EXPECT_LT(packed.segments->num_rows(), unpacked.size());
  EXPECT_EQ(packed.segments->num_segments(), unpacked.size());
  EXPECT_EQ(packed.tokens, unpacked.tokens);
  EXPECT_EQ(packed.attention_mask.sum().item<int64_t>(), unpacked.attention_mask.sum().item<int64_t>());
  EXPECT_LT(packed.input_ids.numel(), unpacked.input_ids.numel());
  std::multiset<size_t> pi(packed.indices.begin(), packed.indices.end()), ui(unpacked.indices.begin(),
                                                                               unpacked.indices.end());
  EXPECT_EQ(pi, ui);
  // Every segment is its unpacked sample; images follow the packed token order.
  std::vector<at::Tensor> images;
  int64_t seg = 0;
  for (int64_t r = 0; r < packed.segments->num_rows(); ++r) {
    int64_t start = 0;
    for (int64_t len : packed.segments->rows[static_cast<size_t>(r)]) {
      const size_t idx = packed.indices[static_cast<size_t>(seg)];
      const int64_t s = std::find(unpacked.indices.begin(), unpacked.indices.end(), idx) - unpacked.indices.begin();
      EXPECT_EQ(len, unpacked.attention_mask[s].sum().item<int64_t>());
      expect_same_sample(unpacked, s, packed, r, start, len);
      int64_t img_before = 0;  // images of the unpacked rows before s
      for (int64_t t = 0; t < s; ++t)
        img_before += (unpacked.token_roles[t] == static_cast<int64_t>(TokenRole::kImage)).sum().item<int64_t>() / 4;
      const int64_t n_img = (unpacked.token_roles[s] == static_cast<int64_t>(TokenRole::kImage)).sum().item<int64_t>() / 4;
      for (int64_t k = 0; k < n_img; ++k) images.push_back(unpacked.pixel_values[img_before + k]);
      start += len;
      ++seg;
    }
    EXPECT_LE(start, 2 * longest);
  }
  ASSERT_FALSE(images.empty());
  EXPECT_TRUE(at::stack(images).equal(packed.pixel_values));
}

TEST(Packing, SampleOverTheBudgetIsANamedError) {
  PackDemo demo;
  Dataset ds(demo.config(), demo.tok);
  std::vector<PreparedSample> s{ds.prepare(0), ds.prepare(1)};
  const int64_t n = static_cast<int64_t>(s[1].sample.ids.size());
  const int64_t budget = std::min<int64_t>(n, static_cast<int64_t>(s[0].sample.ids.size())) - 1;
  try {
    collate_packed(s, 0, 28, budget);
    FAIL() << "packed a sample longer than the budget";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than data.pack_to = " + std::to_string(budget)), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("id \""), std::string::npos) << e.what();
  }
}

TEST(Packing, LoaderPacksTheSameSamplesPerMicroBatchAndResumes) {
  PackDemo demo;
  Dataset ds(demo.config(), demo.tok);
  DataLoader plain(ds, loader_config(6, 0, 0));
  std::vector<Batch> packed_runs[2];
  for (int w : {0, 2}) {
    DataLoader dl(ds, loader_config(6, w, 600));
    for (int i = 0; i < 8; ++i) packed_runs[w ? 1 : 0].push_back(dl.next());
  }
  for (int i = 0; i < 8; ++i) {
    const Batch u = plain.next();
    const Batch& p = packed_runs[0][static_cast<size_t>(i)];
    std::multiset<size_t> a(u.indices.begin(), u.indices.end()), b(p.indices.begin(), p.indices.end());
    EXPECT_EQ(a, b) << "micro-batch " << i;
    EXPECT_EQ(u.tokens, p.tokens);
    const Batch& q = packed_runs[1][static_cast<size_t>(i)];
    EXPECT_EQ(p.indices, q.indices);
    EXPECT_TRUE(p.input_ids.equal(q.input_ids));
    EXPECT_TRUE(p.positions.equal(q.positions));
  }
  // Resume at micro-batch 4's position: the same packed batches follow.
  DataLoader first(ds, loader_config(6, 1, 600));
  for (int i = 0; i < 4; ++i) first.next();
  DataLoader resumed(ds, loader_config(6, 1, 600), first.position());
  for (int i = 4; i < 8; ++i) {
    const Batch r = resumed.next();
    EXPECT_EQ(r.indices, packed_runs[0][static_cast<size_t>(i)].indices);
    EXPECT_TRUE(r.input_ids.equal(packed_runs[0][static_cast<size_t>(i)].input_ids));
    EXPECT_EQ(r.segments->rows, packed_runs[0][static_cast<size_t>(i)].segments->rows);
  }
}

// A window whose packing would compute more positions than padding (two longest samples fill a row, a one-token
// sample opens a second row as long) falls back to one sample per row: never more than the padded batch.
TEST(Packing, NeverComputesMorePositionsThanPadding) {
  auto sample = [](size_t index, int64_t n) {
    PreparedSample p;
    p.sample.index = index;
    p.sample.id = "s" + std::to_string(index);
    for (int64_t i = 0; i < n; ++i) {
      p.sample.ids.push_back(5);
      p.sample.labels.push_back(i == n - 1 ? 5 : -100);
      p.sample.roles.push_back(i == 0 ? TokenRole::kSystem : TokenRole::kAnswer);
    }
    return p;
  };
  std::vector<PreparedSample> worse{sample(0, 64), sample(1, 64), sample(2, 1)};
  const Batch b = collate_packed(worse, 0, 0, 128);
  EXPECT_EQ(b.segments->num_rows(), 3);
  EXPECT_EQ(b.input_ids.numel(), 3 * 64);
  std::vector<PreparedSample> better{sample(0, 64), sample(1, 60), sample(2, 4)};
  const Batch c = collate_packed(better, 0, 0, 128);
  EXPECT_EQ(c.segments->num_rows(), 1);
  EXPECT_EQ(c.input_ids.numel(), 128);
}

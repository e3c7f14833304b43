// DataLoader on the demo dataset: identical output for any worker count, exact resume from DataPosition with
// 1, 2 and 3 ranks (no sample skipped or repeated), bad records skipped and counted, collation, and `gmod
// data check`.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "data/check.h"
#include "data/demo_dataset.h"
#include "data/loader.h"
#include "tests/common/paths.h"
#include "tests/data/demo_config.h"

using namespace gmod;

namespace {

struct Demo {
  gmod::test::TempDir dir;
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"));
  Demo(int n = 60) {
    DemoDatasetOptions o;
    o.num_train = n;
    o.num_heldout = 2;
    o.image_size = 32;
    make_demo_dataset(dir.str(), o);
  }
  DatasetConfig config(const std::string& file = "train.json") const {
    return gmod::test::demo_dataset_config(dir, file);
  }
};

LoaderConfig loader_config(int mb, int rank, int world, int64_t G, int workers) {
  LoaderConfig c;
  c.micro_batch_size = mb;
  c.rank = rank;
  c.world_size = world;
  c.sampler.seed = 11;
  c.sampler.global_batch_size = G;
  c.num_workers = workers;
  c.prefetch = 3;
  c.log_bad_records = false;
  return c;
}

void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_TRUE(a.input_ids.equal(b.input_ids));
  EXPECT_TRUE(a.labels.equal(b.labels));
  EXPECT_TRUE(a.attention_mask.equal(b.attention_mask));
  EXPECT_TRUE(a.token_roles.equal(b.token_roles));
  ASSERT_EQ(a.pixel_values.defined(), b.pixel_values.defined());
  if (a.pixel_values.defined()) {
    EXPECT_TRUE(a.pixel_values.equal(b.pixel_values));
  }
}

}  // namespace

TEST(Loader, OutputDoesNotDependOnTheWorkerCount) {
  Demo demo;
  Dataset ds(demo.config(), demo.tok);
  std::vector<std::vector<Batch>> runs;
  for (int workers : {0, 1, 3}) {
    DataLoader dl(ds, loader_config(4, 0, 1, 8, workers));
    std::vector<Batch> out;
    for (int i = 0; i < 20; ++i) out.push_back(dl.next());  // 20 * 4 = 80 > 56 = one epoch
    EXPECT_EQ(dl.position(), (DataPosition{1, 24}));
    runs.push_back(std::move(out));
  }
  for (size_t r = 1; r < runs.size(); ++r)
    for (size_t i = 0; i < runs[0].size(); ++i) expect_same_batch(runs[0][i], runs[r][i]);
  // first epoch covers 56 distinct records (60 minus a dropped remainder of 4)
  std::set<size_t> seen;
  for (int i = 0; i < 14; ++i) seen.insert(runs[0][i].indices.begin(), runs[0][i].indices.end());
  EXPECT_EQ(seen.size(), 56u);
}

TEST(Loader, BatchesArePaddedAndConvertToModelInputs) {
  Demo demo;
  Dataset ds(demo.config(), demo.tok);
  DataLoader dl(ds, loader_config(4, 0, 1, 4, 1));
  for (int k = 0; k < 5; ++k) {
    Batch b = dl.next();
    ASSERT_EQ(b.size(), 4);
    const int64_t L = b.input_ids.size(1);
    EXPECT_EQ(b.labels.sizes(), b.input_ids.sizes());
    EXPECT_EQ(b.attention_mask.scalar_type(), at::kBool);
    EXPECT_EQ(b.token_roles.scalar_type(), at::kChar);
    EXPECT_EQ(b.input_ids.scalar_type(), at::kLong);
    int64_t images = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t len = b.attention_mask[r].sum().item<int64_t>();
      EXPECT_TRUE(b.attention_mask[r].slice(0, 0, len).all().item<bool>());
      for (int64_t t = len; t < L; ++t) {
        EXPECT_EQ(b.input_ids[r][t].item<int64_t>(), 0);  // pad = unk
        EXPECT_EQ(b.labels[r][t].item<int64_t>(), -100);
        EXPECT_EQ(b.token_roles[r][t].item<int8_t>(), 0);
      }
      images += (b.input_ids[r] == 800).sum().item<int64_t>() / 4;
    }
    if (images > 0) {
      EXPECT_EQ(b.pixel_values.sizes(), (std::vector<int64_t>{images, 3, 28, 28}));
    } else {
      EXPECT_FALSE(b.pixel_values.defined());
    }
    ModelInputs in = to_model_inputs(b, at::kCPU);
    EXPECT_TRUE(in.input_ids.equal(b.input_ids));
    EXPECT_TRUE(in.token_roles.defined());
    EXPECT_FALSE(in.positions.defined());
  }
}

TEST(Loader, JsonAndJsonlFilesGiveTheSameBatches) {
  Demo demo;
  Dataset list(demo.config("train.json"), demo.tok), lines(demo.config("train.jsonl"), demo.tok);
  ASSERT_EQ(list.size(), lines.size());
  DataLoader a(list, loader_config(4, 0, 1, 8, 1)), b(lines, loader_config(4, 0, 1, 8, 2));
  for (int i = 0; i < 6; ++i) expect_same_batch(a.next(), b.next());
}

TEST(Loader, BatchesFeedATinyMultimodalModel) {
  Demo demo;
  Dataset ds(demo.config(), demo.tok);
  LlavaConfig mc;
  mc.text.vocab_size = 832;
  mc.text.hidden_size = 32;
  mc.text.intermediate_size = 64;
  mc.text.num_hidden_layers = 2;
  mc.text.num_attention_heads = 4;
  mc.text.num_key_value_heads = 2;
  mc.vision = ClipVisionConfig{};
  mc.vision->hidden_size = 32;
  mc.vision->intermediate_size = 64;
  mc.vision->num_hidden_layers = 2;
  mc.vision->num_attention_heads = 4;
  mc.vision->image_size = 28;  // = crop size of the test dataset
  mc.vision->patch_size = 14;
  mc.image_token_id = 800;
  ASSERT_EQ(mc.image_seq_length(), ds.config().conversation.image_seq_length);
  MultimodalLM model(mc);
  model.init_weights(0);
  DataLoader dl(ds, loader_config(4, 0, 1, 4, 1));
  for (int i = 0; i < 3; ++i) {
    Batch b = dl.next();
    auto out = model.forward(to_model_inputs(b, at::kCPU));
    EXPECT_TRUE(std::isfinite(out.lm_loss.item<float>()));
    EXPECT_EQ(out.supervised_tokens,
              (b.labels.narrow(1, 1, b.labels.size(1) - 1) != -100).sum().item<int64_t>());
    EXPECT_GT(out.supervised_tokens, 0);
  }
}

// Train with `world_a` ranks for `steps_a` optimizer steps, save the position, resume with `world_b` ranks:
// the union of consumed samples over all ranks is exactly the permutation prefix, none twice.
void check_resume(int world_a, int mb_a, int world_b, int mb_b, bool grouped = false) {
  Demo demo(100);
  Dataset ds(demo.config(), demo.tok);
  const int64_t G = 12;
  SamplerConfig sc = loader_config(1, 0, 1, G, 0).sampler;
  sc.group_by_modality_length = grouped;
  const auto order = epoch_order(ds.size(), sc, 0, grouped ? ds.modality_lengths() : std::vector<int64_t>{});
  std::vector<size_t> consumed;
  auto run = [&](int world, int mb, DataPosition start, int steps) {
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r) {
      LoaderConfig lc = loader_config(mb, r, world, G, 2);
      lc.sampler = sc;
      ranks.push_back(std::make_unique<DataLoader>(ds, lc, start));
    }
    const int64_t accum = ranks[0]->accumulation_steps();
    for (int s = 0; s < steps; ++s)
      for (int64_t a = 0; a < accum; ++a)
        for (auto& l : ranks) {
          Batch b = l->next();
          std::vector<size_t> got = b.indices;
          for (const auto& bad : b.skipped) got.push_back(bad.index);
          std::sort(got.begin(), got.end());
          consumed.insert(consumed.end(), got.begin(), got.end());
        }
    for (auto& l : ranks) EXPECT_EQ(l->position(), ranks[0]->position());
    return ranks[0]->position();
  };
  DataPosition p = run(world_a, mb_a, {}, 3);
  EXPECT_EQ(p, (DataPosition{0, 3 * G}));
  const DataPosition restored = data_position_from_json(to_json(p));
  p = run(world_b, mb_b, restored, 3);
  EXPECT_EQ(p, (DataPosition{0, 6 * G}));
  ASSERT_EQ(consumed.size(), static_cast<size_t>(6 * G));
  std::vector<size_t> want(order.begin(), order.begin() + 6 * G), got = consumed;
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want) << "resume " << world_a << " -> " << world_b << " ranks skipped or repeated samples";
}

TEST(Loader, ResumeAcrossRankCountsContinuesExactly) {
  check_resume(1, 4, 2, 2);
  check_resume(2, 2, 3, 2);
  check_resume(3, 2, 1, 12);
  check_resume(2, 3, 2, 3);
  check_resume(2, 2, 3, 4, /*grouped=*/true);
}

TEST(Loader, ResumeRejectsPositionsOffAMicroStepBoundary) {
  Demo demo;
  Dataset ds(demo.config(), demo.tok);
  EXPECT_THROW(DataLoader(ds, loader_config(4, 0, 1, 8, 0), DataPosition{0, 6}), std::invalid_argument);
  EXPECT_THROW(DataLoader(ds, loader_config(3, 0, 1, 8, 0)), std::invalid_argument);     // 8 % 3
  EXPECT_THROW(DataLoader(ds, loader_config(4, 0, 1, 1000, 0)), std::invalid_argument);  // > N
}

namespace {

// A small dataset where records 1..5 are bad in different ways.
std::string write_bad_dataset(const Demo& demo) {
  const std::string path = demo.dir.str("bad.json");
  std::ofstream f(path);
  f << "[\n"
    << R"({"id": "ok0", "image": "images/train_000000.png", "conversations": [{"from": "human", "value": "<image>\nQ?"}, {"from": "gpt", "value": "A"}]},)"
    << "\n"
    << R"({"id": "missing-image", "image": "images/nope.png", "conversations": [{"from": "human", "value": "<image>\nQ?"}, {"from": "gpt", "value": "A"}]},)"
    << "\n"
    << R"({"id": "no-placeholder", "image": "images/train_000000.png", "conversations": [{"from": "human", "value": "Q?"}, {"from": "gpt", "value": "A"}]},)"
    << "\n"
    << R"({"id": "no-answer", "conversations": [{"from": "human", "value": "Q?"}]},)"
    << "\n"
    << R"({"id": "malformed", "conversations": [{"from": "human", "value": 1}]},)"
    << "\n"
    << R"({"id": "too-long", "conversations": [{"from": "human", "value": ")" <<
      [] {
        std::string s;
        for (int i = 0; i < 400; ++i) s += "abc def ";
        return s;
      }()
    << R"("}, {"from": "gpt", "value": "A"}]},)"
    << "\n";
  for (int i = 6; i < 16; ++i)
    f << R"({"id": "ok)" << i
      << R"(", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]})"
      << (i < 15 ? ",\n" : "\n");
  f << "]\n";
  return path;
}

}  // namespace

TEST(Loader, BadRecordsAreSkippedCountedAndLimited) {
  Demo demo(8);
  write_bad_dataset(demo);
  Dataset ds(demo.config("bad.json"), demo.tok);
  ASSERT_EQ(ds.size(), 16u);
  LoaderConfig lc = loader_config(16, 0, 1, 16, 2);
  lc.max_bad_fraction = 1.0;
  {
    DataLoader dl(ds, lc);
    Batch b = dl.next();
    EXPECT_EQ(b.size(), 11);
    ASSERT_EQ(b.skipped.size(), 5u);
    std::map<std::string, std::string> reason_of;
    for (const auto& bad : b.skipped) reason_of[bad.id] = bad.reason;
    EXPECT_EQ(reason_of["missing-image"], "image");
    EXPECT_EQ(reason_of["no-placeholder"], "placeholder");
    EXPECT_EQ(reason_of["no-answer"], "no_answer");
    EXPECT_EQ(reason_of["malformed"], "malformed");
    EXPECT_EQ(reason_of["too-long"], "too_long");
    for (const auto& bad : b.skipped) {
      EXPECT_NE(bad.message.find("bad.json: record " + std::to_string(bad.index)), std::string::npos)
          << bad.message;
    }
    auto st = dl.stats();
    EXPECT_EQ(st.bad(), 5);
    EXPECT_EQ(st.seen, 16);
    EXPECT_EQ(st.samples, 11);
    dl.next();
    EXPECT_EQ(dl.stats().bad(), 10);  // counted again in the next epoch, logged once
  }
  lc.max_bad_records = 4;
  {
    DataLoader dl(ds, lc);
    try {
      dl.next();
      ADD_FAILURE() << "no error past max_bad_records";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("max_bad_records=4"), std::string::npos) << e.what();
    }
  }
  lc.max_bad_records = -1;
  lc.max_bad_fraction = 0.1;
  lc.bad_fraction_min_seen = 10;
  {
    DataLoader dl(ds, lc);
    EXPECT_THROW(dl.next(), std::runtime_error);
  }
  // truncation "skip" vs "turn" only matters for multi-round records; kSkip drops the too-long one as well
}

TEST(DataCheck, ReportsEveryProblemAndASummary) {
  Demo demo(8);
  const std::string bad = write_bad_dataset(demo);
  std::ostringstream out, err;
  const std::vector<std::string> args = {bad,
                                         "--images",
                                         demo.dir.str(),
                                         "--tokenizer",
                                         gmod::test::fixture("tokenizer/sp/tokenizer.model"),
                                         "--max-len",
                                         "512",
                                         "--image-tokens",
                                         "4",
                                         "--image-token-id",
                                         "800",
                                         "--workers",
                                         "2"};
  EXPECT_EQ(run_data_check(args, out, err), 1) << err.str();
  const std::string text = out.str();
  for (const char* id : {"missing-image", "no-placeholder", "no-answer", "malformed", "too-long"})
    EXPECT_NE(text.find(std::string("'") + id + "'"), std::string::npos) << text;
  EXPECT_NE(text.find("16 records, 11 usable, 5 with problems"), std::string::npos) << text;

  std::ostringstream out2, err2;
  std::vector<std::string> good = args;
  good[0] = demo.dir.str("train.json");
  EXPECT_EQ(run_data_check(good, out2, err2), 0) << out2.str() << err2.str();
  EXPECT_NE(out2.str().find("8 records, 8 usable, 0 with problems"), std::string::npos) << out2.str();

  std::ostringstream out3, err3;
  EXPECT_EQ(run_data_check({bad, "--bogus"}, out3, err3), 2);
  EXPECT_NE(err3.str().find("unknown option --bogus"), std::string::npos);
}

// group_by_modality_length's lengths (LLaVA's rule: words of every turn, +128 with an image, negative for
// text-only) are computed once, on every core, and cached beside the index: a second start reads them instead of
// parsing every record, and a changed file invalidates them with the index. The expected lengths come from how the
// records were generated, not from the code.
TEST(Loader, ModalityLengthsAreComputedInParallelOnceAndCachedWithTheIndex) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("many.jsonl");
  const int n = 9000;  // more than two workers' minimum share (4096 records each)
  std::vector<int64_t> expected;
  {
    std::ofstream f(path);
    for (int i = 0; i < n; ++i) {
      const int q = 1 + i % 5, a = 1 + i % 7;  // words in the question and the answer
      const bool image = i % 3 == 0;
      std::string qs = image ? "<image>" : "", as;
      for (int w = image ? 1 : 0; w < q; ++w) qs += (qs.empty() ? "" : " ") + std::string("w") + std::to_string(w);
      for (int w = 0; w < a; ++w) as += (w ? "\\t" : "") + std::string("x");  // JSON escapes: tab, newline
      f << R"({"id": )" << i << (image ? R"(, "image": "im.png")" : "") << R"(, "conversations": [{"from": "human", )"
        << R"("value": ")" << qs << R"("}, {"from": "gpt", "value": ")" << (a > 3 ? "\\n" : "") << as << R"("}]})"
        << "\n";
      expected.push_back(image ? q + a + 128 : -(q + a));
    }
  }
  auto lengths_of = [&](bool cache) {
    DatasetConfig c;
    c.data_path = path;
    c.image_folder = dir.str();
    c.use_index_cache = cache;
    return Dataset(c, load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"))).modality_lengths();
  };
  const auto side = RecordFile::cache_path(path) + ".modality_lengths.v1";
  EXPECT_EQ(lengths_of(false), expected);
  EXPECT_FALSE(std::filesystem::exists(side)) << "use_index_cache = false wrote a cache";
  EXPECT_EQ(lengths_of(true), expected);
  ASSERT_TRUE(std::filesystem::exists(side));
  // The next start reads the cache: planted values there are what it returns.
  RecordFile rf(path);
  std::vector<int64_t> planted(n, 7);
  ASSERT_TRUE(rf.write_derived("modality_lengths.v1", planted));
  EXPECT_EQ(lengths_of(true), planted);
  // A changed file (one record more) invalidates index and lengths alike.
  {
    std::ofstream f(path, std::ios::app);
    f << R"({"id": "new", "conversations": [{"from": "human", "value": "a b"}, {"from": "gpt", "value": "c"}]})"
      << "\n";
  }
  expected.push_back(-3);
  EXPECT_EQ(lengths_of(true), expected);
}

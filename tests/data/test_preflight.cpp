// The data guard before training (data/preflight.h) with 1, 2 and 3 simulated ranks, image paths that leave the
// image folder, the pixel limit through Dataset and `gmod data check`, an empty dataset, and ARank's named errors
// when it finds no usable sample.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "data/arank_samples.h"
#include "data/check.h"
#include "data/demo_dataset.h"
#include "data/preflight.h"
#include "tests/common/paths.h"
#include "tests/data/demo_config.h"

using namespace gmod;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_preflight {
namespace {

struct PreflightDemo {
  gmod::test::TempDir dir;
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"));
  explicit PreflightDemo(int n = 8) {
    DemoDatasetOptions o;
    o.num_train = n;
    o.num_heldout = 2;
    o.image_size = 32;
    o.text_only_fraction = 0;  // every demo record has an image
    make_demo_dataset(dir.str(), o);
  }
  DatasetConfig config(const std::string& file) const {
    return gmod::test::demo_dataset_config(dir, file);
  }
  // Writes records (JSON objects, one per string) as a JSON list.
  std::string write(const std::string& file, const std::vector<std::string>& records) const {
    std::ofstream f(dir.str(file));
    f << "[\n";
    for (size_t i = 0; i < records.size(); ++i) f << records[i] << (i + 1 < records.size() ? ",\n" : "\n");
    f << "]\n";
    return dir.str(file);
  }
};

std::string image_record(const std::string& id, const std::string& image) {
  return R"({"id": ")" + id + R"(", "image": ")" + image +
         R"(", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A shape."}]})";
}
std::string text_record(const std::string& id) {
  return R"({"id": ")" + id +
         R"(", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]})";
}

// 20 records: 12 usable (image and text), 8 unusable of four kinds.
std::vector<std::string> mixed_records() {
  std::vector<std::string> r;
  for (int i = 0; i < 6; ++i) r.push_back(image_record("img" + std::to_string(i), "images/train_00000" + std::to_string(i) + ".png"));
  for (int i = 0; i < 6; ++i) r.push_back(text_record("txt" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) r.push_back(image_record("missing" + std::to_string(i), "images/nope.png"));
  for (int i = 0; i < 2; ++i) r.push_back(image_record("escape" + std::to_string(i), "../outside.png"));
  r.push_back(R"({"id": "no-answer", "conversations": [{"from": "human", "value": "Q?"}]})");
  r.push_back(R"({"id": "malformed1", "conversations": [{"from": "human", "value": 1}]})");
  r.push_back(R"({"id": "malformed2", "conversations": "nope"})");
  return r;
}

std::vector<size_t> identity(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// preflight_check on `world` ranks simulated by threads; the sum is a barrier-synchronised in-process all-reduce.
std::vector<PreflightReport> run_ranks(const Dataset& ds, const std::vector<size_t>& order, PreflightOptions o,
                                       int world) {
  std::mutex m;
  std::condition_variable cv;
  std::vector<double> total;
  int arrived = 0, left = 0;
  auto sum = [&](std::vector<double>& v) {
    std::unique_lock<std::mutex> lk(m);
    if (total.empty()) total.assign(v.size(), 0.0);
    for (size_t i = 0; i < v.size(); ++i) total[i] += v[i];
    if (++arrived == world) cv.notify_all();
    cv.wait(lk, [&] { return arrived == world; });
    v = total;
    ++left;
  };
  std::vector<PreflightReport> out(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      PreflightOptions mine = o;
      mine.rank = r;
      mine.world_size = world;
      out[size_t(r)] = preflight_check(ds, order, mine, world > 1 ? SumOverRanks(sum) : SumOverRanks());
    });
  for (auto& t : ts) t.join();
  return out;
}

}  // namespace

TEST(Preflight, SameVerdictAndCountsForAnyWorldSize) {
  PreflightDemo demo;
  demo.write("mixed.json", mixed_records());
  Dataset mixed(demo.config("mixed.json"), demo.tok);
  ASSERT_EQ(mixed.size(), 20u);
  // Reversed order: the bad records come first, so the first 10 positions are 8 bad + 2 text.
  std::vector<size_t> order = identity(20);
  std::reverse(order.begin(), order.end());
  const std::map<std::string, int64_t> all_bad = {{"image", 3}, {"image_path", 2}, {"malformed", 2}, {"no_answer", 1}};
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    PreflightOptions o;
    o.workers = 2;
    o.records = -1;
    o.max_bad_fraction = 0.5;  // 8 of 20 = 40%: passes
    for (const auto& rep : run_ranks(mixed, order, o, world)) {
      EXPECT_TRUE(rep.passed) << rep.error;
      EXPECT_EQ(rep.checked, 20);
      EXPECT_EQ(rep.usable, 12);
      EXPECT_EQ(rep.bad_by_reason, all_bad);
      EXPECT_NE(rep.summary().find("mixed.json: the first 20 of 20 records in training order checked: 12 usable, 8 not "
                                   "(image: 3, image_path: 2, malformed: 2, no_answer: 1)"),
                std::string::npos)
          << rep.summary();
    }
    o.records = 10;  // the first 10 of the order: 8 bad (80%) > 50%
    const auto reps = run_ranks(mixed, order, o, world);
    for (const auto& rep : reps) {
      EXPECT_FALSE(rep.passed);
      EXPECT_EQ(rep.checked, 10);
      EXPECT_EQ(rep.usable, 2);
      EXPECT_EQ(rep.bad_by_reason, all_bad);
    }
    const std::string& e = reps[0].error;  // rank 0 has one example of each kind, in order
    EXPECT_NE(e.find(demo.dir.str("mixed.json") + ": 8 of the first 10 of 20 records in training order are unusable "
                     "(80.0%; image: 3, image_path: 2, malformed: 2, no_answer: 1), more than max_bad_fraction = 0.5"),
              std::string::npos)
        << e;
    ASSERT_EQ(reps[0].examples.size(), 4u) << e;
    EXPECT_EQ(reps[0].examples[0].rfind("[malformed] ", 0), 0u) << reps[0].examples[0];
    EXPECT_NE(e.find("[image_path] " + demo.dir.str("mixed.json") + ": record 16 (id 'escape1'): image path "
                     "'../outside.png' leaves the image folder"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("[image] " + demo.dir.str("mixed.json") + ": record 14 (id 'missing2')"), std::string::npos) << e;
    EXPECT_NE(e.find("stopped before training (run `gmod data check` for the full list)"), std::string::npos) << e;
  }
}

TEST(Preflight, NoUsableRecordOrNoRecordAlwaysFails) {
  PreflightDemo demo;
  demo.write("allbad.json", {image_record("a", "images/nope.png"), image_record("b", "/etc/passwd"),
                             text_record("c").replace(text_record("c").find("gpt"), 3, "human")});
  Dataset ds(demo.config("allbad.json"), demo.tok);
  PreflightOptions o;
  o.max_bad_fraction = 1.0;  // even a fraction of 1 does not let a dataset without a usable record through
  const PreflightReport rep = preflight_check(ds, identity(ds.size()), o);
  EXPECT_FALSE(rep.passed);
  EXPECT_EQ(rep.usable, 0);
  EXPECT_EQ(rep.bad_by_reason, (std::map<std::string, int64_t>{{"image", 1}, {"image_path", 1}, {"roles", 1}}));
  EXPECT_NE(rep.error.find("3 of the first 3 of 3 records in training order are unusable (100.0%; image: 1, "
                           "image_path: 1, roles: 1); none is usable, training would learn nothing"),
            std::string::npos)
      << rep.error;
  EXPECT_NE(rep.error.find("image path '/etc/passwd' is absolute"), std::string::npos) << rep.error;

  demo.write("empty.json", {});
  Dataset empty(demo.config("empty.json"), demo.tok);
  const PreflightReport e = preflight_check(empty, {}, o);
  EXPECT_FALSE(e.passed);
  EXPECT_EQ(e.error, demo.dir.str("empty.json") + ": the dataset has no records; nothing to train on");
  PreflightOptions bad = o;
  bad.records = 0;
  EXPECT_THROW(preflight_check(empty, {}, bad), std::invalid_argument);
  bad.max_bad_fraction = std::nan("");
  bad.records = 5;
  demo.write("good.json", {text_record("x")});
  Dataset good(demo.config("good.json"), demo.tok);
  EXPECT_FALSE(preflight_check(good, identity(1), bad).passed);  // NaN fails closed
  EXPECT_TRUE(preflight_check(good, identity(1), o).passed);
}

// Paths are checked on their text: absolute, NUL, or climbing above the folder is refused; staying inside is fine.
TEST(Preflight, ImagePathsMustStayInsideTheImageFolder) {
  PreflightDemo demo;
  demo.write("one.json", {text_record("x")});
  Dataset ds(demo.config("one.json"), demo.tok);
  for (const char* ok : {"images/a.png", "./images/a.png", "images/../b.png", "a/b/../../c.png", "images//a.png"})
    EXPECT_EQ(ds.image_path(ok), demo.dir.str(ok)) << ok;
  for (const char* bad : {"../a.png", "images/../../a.png", "a/./../..", "/abs/a.png", "..", "x/../../../etc/passwd"})
    EXPECT_THROW(ds.image_path(bad), std::invalid_argument) << bad;
  EXPECT_THROW(ds.image_path(std::string("images/a.png\0../../x", 20)), std::invalid_argument);
  try {
    ds.image_path("images/../../secret.png");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "image path 'images/../../secret.png' leaves the image folder " + demo.dir.str() +
                                         " ('..' above it is refused)");
  }
}

// data.max_image_pixels through Dataset and --max-image-pixels through `gmod data check` (the demo images are 32 x 32
// = 1024 pixels); an empty dataset is exit code 1, named.
TEST(Preflight, PixelLimitAndEmptyDatasetInDataCheck) {
  PreflightDemo demo;
  DatasetConfig c = demo.config("train.json");
  c.max_image_pixels = 1023;
  Dataset ds(c, demo.tok);
  PreparedSample s;
  BadRecord b;
  ASSERT_FALSE(ds.try_prepare(0, s, b));
  EXPECT_EQ(b.reason, "image");
  EXPECT_NE(b.message.find("32x32 = 1024 pixels, more than the decoded-pixel limit of 1023"), std::string::npos)
      << b.message;
  c.max_image_pixels = 1024;
  EXPECT_TRUE(Dataset(c, demo.tok).try_prepare(0, s, b)) << b.message;

  const std::vector<std::string> args = {demo.dir.str("train.json"), "--images", demo.dir.str(), "--tokenizer",
                                         gmod::test::fixture("tokenizer/sp/tokenizer.model"), "--image-tokens", "4",
                                         "--image-token-id", "800"};
  for (bool decode : {true, false}) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--max-image-pixels", "1023"});
    if (!decode) a.push_back("--no-decode");  // the header check still applies
    std::ostringstream out, err;
    EXPECT_EQ(run_data_check(a, out, err), 1) << err.str();
    EXPECT_NE(out.str().find("8 records, 0 usable, 8 with problems (image: 8)"), std::string::npos) << out.str();
    EXPECT_NE(out.str().find("more than the decoded-pixel limit of 1023"), std::string::npos) << out.str();
  }
  std::ostringstream out0, err0;
  EXPECT_EQ(run_data_check(args, out0, err0), 0) << out0.str() << err0.str();
  std::ostringstream out1, err1;
  std::vector<std::string> a = args;
  a.insert(a.end(), {"--max-image-pixels", "0"});
  EXPECT_EQ(run_data_check(a, out1, err1), 2);
  EXPECT_NE(err1.str().find("--max-image-pixels must be >= 1"), std::string::npos) << err1.str();

  std::vector<std::string> e = args;
  e[0] = demo.write("empty.json", {});
  std::ostringstream out2, err2;
  EXPECT_EQ(run_data_check(e, out2, err2), 1) << err2.str();
  EXPECT_NE(out2.str().find(e[0] + ": no records (an empty dataset)"), std::string::npos) << out2.str();
}

// ARank's sampling walks the order once and stops with a named error when nothing fits (no endless loop): every
// record unusable, or only text-only records for the paper's image-only protocol.
TEST(Preflight, ArankStopsWithANamedErrorWithoutUsableSamples) {
  PreflightDemo demo;
  demo.write("allbad.json", {image_record("a", "images/nope.png"), image_record("b", "../x.png")});
  demo.write("text.json", {text_record("a"), text_record("b"), text_record("c")});
  ARankSampling opt;
  opt.samples = 50;
  {
    Dataset ds(demo.config("allbad.json"), demo.tok);
    ARankSamplingStats st;
    try {
      arank_batches(ds, identity(ds.size()), opt, st);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(demo.dir.str("allbad.json") + ": no sample usable for ARank among 2 records "
                                           "(0 text-only, 2 bad"),
                std::string::npos)
          << e.what();
    }
  }
  {
    Dataset ds(demo.config("text.json"), demo.tok);
    ARankSamplingStats st;
    try {
      arank_batches(ds, identity(ds.size()), opt, st);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("among 3 records (3 text-only, 0 bad"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("ARank needs image samples"), std::string::npos) << e.what();
    }
    opt.images_only = false;  // text samples are fine for the training protocol: fewer than asked, no error
    ARankSamplingStats st2;
    const auto batches = arank_batches(ds, identity(ds.size()), opt, st2);
    EXPECT_EQ(st2.taken, 3);
    EXPECT_FALSE(batches.empty());
  }
}

// Issue 45: records.h reads videos; a model without video input (here LLaVA: no VideoPreparer) refuses them: reason
// "video", naming the record (Qwen2.5-VL trains on them: test_qwen2_5_vl_video.cpp).
TEST(Preflight, VideoRecordsAreRefusedByName) {
  PreflightDemo demo;
  demo.write("video.json", {text_record("t0"),
                            R"({"id": "v0", "video": "clips/a.mp4", "conversations": [{"from": "human", "value": )"
                            R"("<video>What happens?"}, {"from": "gpt", "value": "A ball rolls."}]})",
                            R"({"id": "v1", "videos": ["b.mp4"], "messages": [{"role": "user", )"
                            R"("content": "<video>?"}, {"role": "assistant", "content": "Nothing."}]})"});
  Dataset ds(demo.config("video.json"), demo.tok);
  ASSERT_EQ(ds.size(), 3u);
  PreparedSample out;
  BadRecord bad;
  EXPECT_TRUE(ds.try_prepare(0, out, bad));
  for (size_t i : {size_t(1), size_t(2)}) {
    ASSERT_FALSE(ds.try_prepare(i, out, bad));
    EXPECT_EQ(bad.reason, "video");
    EXPECT_NE(bad.message.find("record " + std::to_string(i)), std::string::npos) << bad.message;
    EXPECT_NE(bad.message.find("takes no video input"), std::string::npos) << bad.message;
  }
}

}  // namespace test_preflight

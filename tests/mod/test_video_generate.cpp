// Generation from a prompt with a video (issue 45, item 6): the prefill runs the forward's own inputs
// (MultimodalLM::decoder_inputs: the video spliced in, its 3-D ids from video_grid_thw and second_per_grid_ts), and
// the held-out evaluation's exact match (mod/answer_match.cpp) hands each row its own videos. Checked on the tiny
// Qwen2.5-VL and the video record of tests/fixtures/make_qwen2_5_vl_video_fixtures.py (transformers 5.24.0):
// record 0's prompt through its first answer token, at the processor's pixel values, gives as the first step's
// logits transformers' logits at that position, with the KV cache and recomputed; the exact match counts the
// record with its video. Planted by hand: the prefill without the video (its tokens embedded as text) turns both
// generation cases red.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/model_data.h"
#include "data/tokenizer.h"
#include "mod/answer_match.h"
#include "mod/generate.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

namespace gmod {
namespace test_video_generate {

std::string model_dir() { return test::fixture("qwen2_5_vl/data/model"); }
std::string video_dir() { return test::fixture("qwen2_5_vl/video"); }

TEST(VideoGenerate, FirstStepFromAVideoPromptMatchesTransformers) {
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(model_dir());
  auto model = load_pretrained(model_dir());
  model->eval();
  DatasetConfig dc;
  dc.data_path = video_dir() + "/train.json";
  dc.image_folder = test::fixture("");
  dc.use_index_cache = false;  // never write next to the committed fixture
  dc.conversation.template_name = resolve_conversation_template("auto", model->config.text);
  dc.sample.max_len = 4096;
  configure_for_model(dc, model->config, model_dir(), tok);  // as `gmod train` and `gmod eval` set it up
  ASSERT_TRUE(dc.video_preparer);
  Dataset ds(dc, tok);
  std::vector<PreparedSample> samples = {ds.prepare(0)};
  Batch b = collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  // The processor's pixels (gmod's own decode differs by a uint8 step in a few values: test_qwen2_5_vl_video.cpp).
  const auto ref_json = test::read_reference(video_dir(), "tests/fixtures/make_qwen2_5_vl_video_fixtures.py");
  const auto shape = ref_json["records"][0]["pixel_values_videos_shape"].get<std::vector<int64_t>>();
  b.pixel_values_videos =
      at::tensor(test::read_floats(video_dir() + "/record0.pixel_values_videos.bin", size_t(shape[0] * shape[1])),
                 at::kFloat)
          .view({shape[0], shape[1]});
  const ModelInputs in = to_model_inputs(b, at::kCPU);
  ASSERT_TRUE(in.video_grid_thw.defined());
  const int64_t start = ref_json["records"][0]["answers"][0][0].get<int64_t>();
  ModelInputs prompt;  // through the first answer token: its logits are the reference's first answer row
  prompt.input_ids = in.input_ids.narrow(1, 0, start + 1);
  prompt.token_roles = in.token_roles.narrow(1, 0, start + 1);
  prompt.pixel_values_videos = in.pixel_values_videos;
  prompt.video_grid_thw = in.video_grid_thw;
  prompt.second_per_grid_ts = in.second_per_grid_ts;
  SafetensorsFile ref(video_dir() + "/reference.safetensors");
  const auto want = ref.tensor("record0.answer_logits")[0];
  for (const bool cache : {true, false}) {
    GenerateOptions o;
    o.max_new_tokens = 2;
    o.eos_token_id = -1;
    o.use_cache = cache;
    o.keep_logits = true;
    const auto res = generate(*model, prompt, o);
    const double worst = (res.step_logits[0][0] - want).abs().max().item<double>();
    std::cout << "video prompt, first step (" << (cache ? "cached" : "recomputed") << "): logits vs transformers "
              << worst << "\n";
    EXPECT_LT(worst, 1e-5) << (cache ? "cached" : "recomputed");
  }
  at::NoGradGuard no_grad;
  const auto [hits, counted] = first_answer_exact_match(*model, in);
  EXPECT_EQ(counted, 1);
  EXPECT_LE(hits, counted);
}

}  // namespace test_video_generate
}  // namespace gmod

// The memory plan of LLaVA-NeXT (AnyRes): every image planned at the largest pinpoint, its base tile and whole grid
// through the CLIP tower and its base + grid + newline tokens in the sequence (trainer/plan/tower_costs.h
// anyres_image_bound), on the tiny fixture model (tests/fixtures/llava_next/data/model: 16 px tiles of 4 px
// patches, LLaVA-v1.6's pinpoints scaled from 336 to 16).
#include <gtest/gtest.h>

#include <string>

#include "model/anyres_grid.h"
#include "model/pretrained.h"
#include "tests/common/paths.h"
#include "trainer/plan/memory_plan.h"

using namespace gmod;

namespace {

LlavaConfig tiny_next() { return load_model_config(test::fixture("llava_next/data/model")); }

int64_t term(const MemoryPlan& p, const std::string& name) {
  for (const auto& t : p.terms)
    if (t.name == name) return t.bytes;
  ADD_FAILURE() << "no term " << name;
  return 0;
}

}  // namespace

// The 32x32 pinpoint's 2x2 grid gives the most: 5 tiles and 16 + 8 * (8 + 1) = 88 tokens, the count
// transformers' LlavaNextProcessor gives a 26x26 image that fills that grid (tests/fixtures/anyres/manifest.json,
// square_v16: 5 tiles, 88 tokens); every pinpoint's own count is at most that.
TEST(LlavaNextPlan, ImagesArePlannedAtTheLargestPinpoint) {
  const LlavaConfig c = tiny_next();
  ASSERT_TRUE(c.anyres && c.vision);
  const AnyresBound b = anyres_image_bound(c);
  EXPECT_EQ(b.tiles, 5);
  EXPECT_EQ(b.tokens, 88);
  EXPECT_EQ(anyres_image_tokens(26, 26, *c.anyres, 16, 4), 88);
  for (const auto& p : c.anyres->pinpoints) {
    EXPECT_LE(anyres_image_tokens(p[0], p[1], *c.anyres, 16, 4), b.tokens);
    EXPECT_LE(anyres_num_tiles(p[0], p[1], *c.anyres, 16), b.tiles);
  }
  LlavaConfig plain = c;
  plain.anyres.reset();
  EXPECT_EQ(anyres_image_bound(plain).tiles, 1);
  EXPECT_EQ(anyres_image_bound(plain).tokens, plain.image_seq_length());
}

// The batch's pixel values (fp32 and the compute-dtype copy) hold 5 tiles an image, and the trained tower's saved
// activations grow with the tiles: against the same model without AnyRes (one crop an image), exactly 4 more crops'
// pixels; a max_len the largest image does not fit is refused by name.
TEST(LlavaNextPlan, TilesCountInTheBatchAndTheTower) {
  MemoryPlanInputs in;
  in.model = tiny_next();
  in.dtype = "bf16";
  in.micro_batch = 2;
  in.seq_len = 256;
  in.train_vision = true;
  LlavaConfig plain = in.model;
  plain.anyres.reset();
  MemoryPlanInputs one = in;
  one.model = plain;
  const MemoryPlan p = plan_memory(in), q = plan_memory(one);
  const int64_t crop = 3 * 16 * 16;
  EXPECT_EQ(term(p, "batch_inputs") - term(q, "batch_inputs"), int64_t(2) * 4 * crop * (4 + 2));
  EXPECT_GT(p.activations_saved, q.activations_saved);
  in.seq_len = 80;
  try {
    plan_memory(in);
    ADD_FAILURE() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("AnyRes image(s) of up to 88 LLM tokens each (5 tiles at the largest "
                                         "pinpoint) do not fit data.max_len 80"),
              std::string::npos)
        << e.what();
  }
}

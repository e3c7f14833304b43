// Where gmod deliberately differs from the original LLaVA-HR, shown both ways (docs/models.md, "Where gmod
// differs from the original"): the original's prepare_inputs_labels_for_multimodal, run unpatched on a
// left-padded batch by tests/fixtures/make_llava_hr_splice_fixture.py, prepends `True`s to a padded row's
// attention mask, so the mask marks the row's padding as real and as many image positions as padding. gmod
// splices at the expanded image positions with the row's own mask. These tests pin: gmod equals the corrected
// splice; the original's mask is wrong exactly at those positions and nowhere else; the original's logits
// differ from gmod's exactly in the rows it masks wrongly; and gmod given the original's (wrong) mask
// reproduces the original's output, so the mask is the only difference. Model and pixels: the hr384_frozen
// fixture (original modules, random tiny weights).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

constexpr double kTol = 1e-5;

struct SpliceCase {
  std::shared_ptr<MultimodalLM> model;
  SafetensorsFile ref{test::fixture("llava_hr/splice_left_padding/reference.safetensors")};
  ModelInputs in;      // the expanded batch with the correct mask
  at::Tensor columns;  // [P] the text columns the logits are stored at
  at::Tensor pads;     // [B] left padding of each row (zeros of the unexpanded mask the original was given)

  SpliceCase() {
    const auto src = test::fixture("llava_hr/hr384_frozen");
    model = load_pretrained(src);
    SafetensorsFile pixels(src + "/reference.safetensors");
    in.input_ids = ref.tensor("input.input_ids").clone();
    in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
    in.labels = ref.tensor("input.labels").clone();
    const int64_t B = in.input_ids.size(0);
    in.pixel_values =
        pixels.tensor("input.pixels_lowres").narrow(0, 0, B).repeat_interleave(8, 2).repeat_interleave(8, 3);
    columns = ref.tensor("columns");
    pads = ref.tensor("original.attention_mask_unexpanded").eq(0).sum(1);
  }
  // gmod's logits at the stored columns [B, P, V], with `mask` and `labels`.
  std::pair<at::Tensor, double> run(const at::Tensor& mask, const at::Tensor& labels) {
    at::NoGradGuard ng;
    ModelInputs x = in;
    x.attention_mask = mask;
    x.labels = labels;
    auto out = model->forward(x);
    return {out.logits.index_select(1, columns), out.lm_loss.item<double>()};
  }
};

// Largest |a - b| over the vocabulary at each (row, column): [B, P].
at::Tensor max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().amax(2); }

TEST(LlavaHrSplice, FixtureHasAnUnpaddedAndALeftPaddedRow) {
  SpliceCase c;
  EXPECT_EQ(c.pads[0].item<int64_t>(), 0);
  EXPECT_GT(c.pads[1].item<int64_t>(), 0);
  // Both rows hold one image, so the original keeps the left-padded layout: the same positions as gmod's
  // batch.
  EXPECT_EQ(c.ref.tensor("original.attention_mask").sizes(), c.in.input_ids.sizes());
  EXPECT_TRUE(c.ref.tensor("original.labels").equal(c.in.labels));
}

TEST(LlavaHrSplice, GmodMatchesTheCorrectedSplice) {
  SpliceCase c;
  auto [logits, loss] = c.run(c.in.attention_mask, c.in.labels);
  const at::Tensor valid = c.in.attention_mask.index_select(1, c.columns);  // padding outputs are undefined
  const double err =
      max_diff(logits, c.ref.tensor("corrected.logits")).masked_select(valid).max().item<double>();
  EXPECT_LT(err, kTol) << "max abs logit difference against the corrected splice";
  EXPECT_NEAR(loss, c.ref.tensor("corrected.loss").item<double>(), kTol);
  std::cout << "corrected splice: max logit diff " << err << ", loss " << loss << " (reference "
            << c.ref.tensor("corrected.loss").item<double>() << ")\n";
}

TEST(LlavaHrSplice, OriginalMaskIsWrongExactlyAtTheRowsPaddingAndAsManyImagePositions) {
  SpliceCase c;
  const at::Tensor orig = c.ref.tensor("original.attention_mask").to(at::kBool), ok = c.in.attention_mask;
  const at::Tensor is_image = c.in.input_ids.eq(c.model->config.image_token_id);
  for (int64_t b = 0; b < orig.size(0); ++b) {
    SCOPED_TRACE("row " + std::to_string(b));
    const int64_t p = c.pads[b].item<int64_t>();
    const at::Tensor wrong = orig[b].ne(ok[b]);
    EXPECT_EQ(wrong.sum().item<int64_t>(), 2 * p);
    // Marked real where the row is padding: exactly the row's p padding positions.
    EXPECT_TRUE(at::logical_and(orig[b], ok[b].logical_not()).equal(ok[b].logical_not()));
    // Marked padding where the row is real: p positions, all of them image features.
    const at::Tensor dropped = at::logical_and(orig[b].logical_not(), ok[b]);
    EXPECT_EQ(dropped.sum().item<int64_t>(), p);
    EXPECT_TRUE(at::logical_and(dropped, is_image[b].logical_not()).sum().item<int64_t>() == 0);
  }
}

TEST(LlavaHrSplice, OriginalLogitsDifferExactlyInTheRowsItMasksWrongly) {
  SpliceCase c;
  auto [logits, loss] = c.run(c.in.attention_mask, c.in.labels);
  const at::Tensor d = max_diff(logits, c.ref.tensor("original.logits"));
  // The row's real text positions (another row's image may sit in the same column).
  const at::Tensor valid =
      at::logical_and(c.in.attention_mask, c.in.input_ids.ne(c.model->config.image_token_id))
          .index_select(1, c.columns);
  for (int64_t b = 0; b < d.size(0); ++b) {
    SCOPED_TRACE("row " + std::to_string(b));
    const at::Tensor row = d[b].masked_select(valid[b]);
    if (c.pads[b].item<int64_t>() == 0) {
      EXPECT_LT(row.max().item<double>(), kTol) << "a row the original masks correctly";
    } else {
      // Every real position attends the wrongly admitted padding (causal attention from position 0 on): far
      // above the parity tolerance everywhere.
      EXPECT_GT(row.min().item<double>(), 10 * kTol) << "a left-padded row: " << row;
      EXPECT_GE(row.numel(), 6) << "text before and after the image";
    }
  }
  EXPECT_GT(std::abs(loss - c.ref.tensor("original.loss").item<double>()), 1e-4);
  std::cout << "original vs gmod, max logit diff per row:";
  for (int64_t b = 0; b < d.size(0); ++b)
    std::cout << " " << d[b].masked_select(valid[b]).max().item<double>();
  std::cout << "; loss original " << c.ref.tensor("original.loss").item<double>() << ", gmod " << loss
            << "\n";
}

TEST(LlavaHrSplice, GmodGivenTheOriginalsMaskReproducesTheOriginal) {
  SpliceCase c;
  const at::Tensor orig = c.ref.tensor("original.attention_mask").to(at::kBool);
  auto [logits, loss] = c.run(orig, c.ref.tensor("original.labels"));
  const at::Tensor valid = orig.index_select(1, c.columns);
  const double err =
      max_diff(logits, c.ref.tensor("original.logits")).masked_select(valid).max().item<double>();
  EXPECT_LT(err, kTol) << "max abs logit difference against the original, given its own mask";
  EXPECT_NEAR(loss, c.ref.tensor("original.loss").item<double>(), kTol);
}

}  // namespace

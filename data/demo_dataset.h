// Synthetic LLaVA-format instruction dataset for demos and end-to-end tests: small PNG scenes of coloured
// shapes with exact short answers (colour, shape, count, position), plus text-only records (arithmetic,
// colour mixing). Deterministic from a seed, generated in well under a second for the defaults. Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace gmod {

struct DemoDatasetOptions {
  int num_train = 400;               // records in train.json (image and text-only together)
  int num_heldout = 100;             // records in heldout.json; its images are separate files
  int image_size = 64;               // square images, pixels; >= 32
  uint64_t seed = 1234;
  double text_only_fraction = 0.15;  // share of records without an image
  double multi_turn_fraction = 0.3;  // share of records with 2-3 QA turns
};

// Writes into `out_dir` (created if needed):
//   images/train_NNNNNN.png, images/heldout_NNNNNN.png  RGB scenes: plain background, 1-4 shapes
//       (circle, square, triangle) of distinct colours, one per image quadrant, so left/right and
//       top/bottom are unambiguous; no antialiasing, so the centre pixel of each shape has its exact colour.
//   train.json, heldout.json   LLaVA list format: {"id", "image" (only for image records), "conversations":
//       [{"from":"human","value":"<image>\nWhat colour is the circle?"},{"from":"gpt","value":"Red"}, ...]}
//       `<image>\n` prefixes the first human turn of image records and appears nowhere else.
//   train.jsonl                the train records, one per line.
//   scenes.json                {"images/...png": {"background":[r,g,b], "shapes":[{"shape","colour","rgb",
//       "cx","cy","r"}]}} - the ground truth the answers were derived from.
// Same options => byte-identical files. Throws std::runtime_error naming the path on I/O failure or for
// invalid options.
void make_demo_dataset(const std::string& out_dir, const DemoDatasetOptions& options = {});

}  // namespace gmod

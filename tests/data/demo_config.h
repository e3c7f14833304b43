// The data tests' DatasetConfig for a demo dataset written into `dir` (data/demo_dataset.h): 28 px crops, 4 image
// tokens (id 800) per image, at most 512 tokens per sample.
#pragma once

#include <string>

#include "data/dataset.h"
#include "tests/common/paths.h"

namespace gmod::test {

inline DatasetConfig demo_dataset_config(const TempDir& dir, const std::string& file) {
  DatasetConfig c;
  c.data_path = dir.str(file);
  c.image_folder = dir.str();
  c.conversation.image_seq_length = 4;
  c.conversation.image_token_id = 800;
  c.image.size = 28;
  c.image.crop = 28;
  c.sample.max_len = 512;
  return c;
}

}  // namespace gmod::test

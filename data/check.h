// `gmod data check`: validates every record of a dataset the way training would use it (JSON structure,
// roles, template, placeholders vs images, length, image files decodable) and reports each problem with file,
// record index, id and reason, then a summary.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace gmod {

struct DataCheckOptions {
  std::string data;       // train.json / train.jsonl
  std::string images;     // image folder
  std::string tokenizer;  // tokenizer.model / tokenizer.json / directory
  std::string template_name = "vicuna_v1";
  int max_len = 2048;
  int image_tokens = 576;
  int image_token_id = 32000;
  std::string truncation = "turn";  // turn | skip
  bool image_first = true;
  bool decode_images = true;  // false: only read image headers (file readable, known format, pixel limit)
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // decoded width x height per image
  int workers = 1;
};

struct DataCheckReport {
  size_t records = 0;
  size_t ok = 0;
  size_t truncated = 0;
  int64_t tokens = 0;               // after truncation, images expanded
  std::vector<BadRecord> problems;  // in record order
  std::map<std::string, size_t> by_reason;
};

DataCheckReport check_dataset(const DataCheckOptions& options);

// Entry point for `gmod data check DATA --images DIR --tokenizer T [--template vicuna_v1|plain|chatml]
// [--max-len N] [--image-tokens N] [--image-token-id ID] [--truncation turn|skip] [--no-image-first]
// [--no-decode] [--workers N]`; `args` are the words after `check`. Prints problems and a summary to `out`,
// usage errors to `err`. Returns 0 when every record is usable, 1 when there are problems, 2 on usage errors
// or an unreadable dataset.
int run_data_check(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace gmod

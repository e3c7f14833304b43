// What a model asks of the data path, decided once from the model's config and its processor files, the same for
// `gmod train` (trainer/trainer.cpp) and the commands that read records or prompts (eval, answer, generate, serve:
// launch/cli_model.h): the image token's id and count, the image preprocessing, the image and video preparers and
// where an image goes in its turn. Each caller then sets what is its own (the data file, the template, max_len).
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"

namespace gmod {

struct LlavaConfig;
class Tokenizer;

// Sets dc.conversation.image_token_id / image_seq_length / image_first, dc.image, dc.image_preparer and
// dc.video_preparer for `model`. The preprocessing is `preprocessor_dir`'s preprocessor_config.json when it has one,
// else the encoder's input size; LLaVA-HR at input_image_size (its ConvNeXt tower's CLIPImageProcessor with CLIP's
// mean/std) and Mini-Gemini at image_size_aux (the tower cuts the CLIP crops itself) whatever the file says.
// Native-resolution images carry their own token counts, so image_seq_length is then 1 (never used). Throws
// (std::runtime_error / std::invalid_argument, naming the file or what disagrees) as make_image_preparer and
// make_video_preparer do.
void configure_for_model(DatasetConfig& dc, const LlavaConfig& model, const std::string& preprocessor_dir,
                         const std::shared_ptr<const Tokenizer>& tokenizer);

}  // namespace gmod

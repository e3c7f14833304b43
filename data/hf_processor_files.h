// What a Hugging Face repository needs beside config.json and the weights for AutoTokenizer / AutoProcessor /
// `transformers serve` to take it unedited: tokenizer_config.json (special tokens, `legacy`, the image token, the chat
// template), special_tokens_map.json, chat_template.jinja, for vision models preprocessor_config.json and
// processor_config.json (LlavaProcessor), and generation_config.json. Written by gmod export / convert / merge after
// the tokenizer files (tokenizer.model or tokenizer.json) and any source configs were put into the directory.
//
// Files the source already had are kept and completed: keys the source set stay as it set them (its `legacy`, its
// special tokens); the chat template is always the conversation template the model was trained with
// (data/chat_template.h). A vision tower without a source preprocessor config gets CLIP's settings at its input
// size (what gmod preprocesses with); LLaVA-HR and MGM preprocess once, with CLIP's settings at their input size
// (their ConvNeXt reads those pixels; no second processor), and processor_config.json counts their image tokens.
// Limits, stated in docs/training.md: LLaVA's "pad" aspect ratio has no CLIPImageProcessor setting (a non-square
// image is padded to a square by gmod, cropped by transformers); transformers has no γ-MoD, LLaVA-HR or MGM model
// class, and MGM's grid of crops is no token count LlavaProcessor can express.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/conversation.h"
#include "model/config.h"

namespace gmod {

struct HfProcessorSpec {
  ConversationConfig conversation;  // resolved template (and system prompt, image_first) the model was trained with
  LlavaConfig model;                // image token, tower (absent: a text-only LLM), feature selection
  ClipPreprocessConfig image;       // used when the directory has no preprocessor_config.json
  // Keep a chat template the directory already has (taken over from a Hugging Face source: convert, merge,
  // export --from-hf without --template); false: always the conversation template above (a trained checkpoint).
  bool keep_chat_template = false;
};

// Copies the tokenizer and processor files `from` has (tokenizer.json / .model, tokenizer_config.json,
// special_tokens_map.json, chat_template.jinja / .json, preprocessor_config.json, processor_config.json,
// generation_config.json) into `to`, replacing what `to` has of them.
void copy_processor_files(const std::string& from, const std::string& to);

// Writes or completes the files above in `dir`, which must hold tokenizer.model or tokenizer.json. Returns the
// names of the files written. Throws std::runtime_error naming the file for unreadable JSON in a source config.
std::vector<std::string> write_hf_processor_files(const std::string& dir, const HfProcessorSpec& spec);

}  // namespace gmod

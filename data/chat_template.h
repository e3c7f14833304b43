// A gmod conversation template as a Hugging Face chat template (Jinja, as tokenizer_config.json's `chat_template`
// and chat_template.jinja hold it), so that `apply_chat_template` / AutoProcessor / `transformers serve` / vLLM build
// the prompt the model was trained on: the same text ConversationEncoder tokenizes, up to where an answer starts.
//
// Messages are {"role": "system" | "user" | "assistant", "content": string or [{"type": "image"}, {"type": "text",
// "text": ...}, ...]}; an image item (or an "<image>" in a string) renders as "<image>", which the processor expands to
// the model's image tokens. With ConversationConfig::image_first (the default, as LLaVA) every image of a turn goes to
// its front ("<image>\n" each, then the stripped text). A leading system message replaces the template's system
// prompt. A user turn already ends with the assistant's header (" ASSISTANT:", "<|im_start|>assistant\n", ...): the
// prompt to generate from is the rendering of the conversation up to its last user message, whatever
// add_generation_prompt says.
// BOS (all templates but chatml, qwen2_5 and qwen3_vl start with it): with `bos_first` the template writes `bos_token` first, as
// LLaMA-3's and Mistral's own templates do, for a text LLM's tokenizer (its apply_chat_template adds no special
// tokens). Without, as llava-hf's templates: LlavaProcessor's tokenizer adds it (the documented
// `processor(images=..., text=processor.apply_chat_template(...))` would otherwise start with two).
//
// Every literal is emitted inside a Jinja expression, so the template renders the same under any whitespace settings
// (transformers compiles with trim_blocks and lstrip_blocks).
#pragma once

#include <string>

#include "data/conversation.h"

namespace gmod {

// Throws std::invalid_argument for an unknown template (or "auto": resolve it first).
std::string hf_chat_template(const ConversationConfig& config, bool bos_first = true);

}  // namespace gmod

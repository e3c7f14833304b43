// The tokenizer and processor side of a Hugging Face directory written by gmod export / convert / merge: the source's
// files brought over, then completed so AutoProcessor and `transformers serve` take the directory unedited
// (data/hf_processor_files.h). Header-only so the launch/ glob stays one file per subcommand.
#pragma once

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "data/conversation.h"
#include "data/hf_processor_files.h"
#include "model/llava.h"

namespace gmod::cli {

// `sources`: directories to copy from, later ones replacing earlier ones' files (empty entries skipped).
// `template_name`: the conversation template ("auto": the LLM family's). `keep_source_template`: a chat template
// the source brought stays (a Hugging Face source without an explicit --template).
inline void write_hf_side_files(const MultimodalLM& m, const std::vector<std::string>& sources, const std::string& out,
                                const std::string& template_name, bool keep_source_template) {
  namespace fs = std::filesystem;
  for (const std::string& s : sources)
    if (!s.empty() && fs::is_directory(s)) copy_processor_files(s, out);
  if (!fs::exists(fs::path(out) / "tokenizer.json") && !fs::exists(fs::path(out) / "tokenizer.model")) {
    std::cout << "note: no tokenizer.json or tokenizer.model in the source; " << out
              << " has weights and config only (copy a tokenizer in and rerun for the processor files)\n";
    return;
  }
  if (m.config.qwen_vision || m.config.qwen3_vision) {  // the processor files below are LLaVA's; Qwen-VL's: the source's
    std::cout << "note: " << (m.config.qwen3_vision ? "Qwen3-VL" : "Qwen2.5-VL")
              << ": the source's processor and tokenizer files are copied as they are\n";
    return;
  }
  HfProcessorSpec spec;
  spec.model = m.config;
  spec.conversation.template_name = resolve_conversation_template(template_name, m.config.text);
  spec.conversation.image_token_id = m.config.image_token_id;
  spec.conversation.image_seq_length = m.config.vision ? m.config.image_seq_length() : 1;
  if (m.config.vision) spec.image.size = spec.image.crop = m.config.image_input_size();
  spec.keep_chat_template = keep_source_template;
  const std::vector<std::string> written = write_hf_processor_files(out, spec);
  std::string names;
  for (const auto& w : written) names += (names.empty() ? "" : ", ") + w;
  std::cout << "wrote " << names << " (chat template: "
            << (keep_source_template && std::find(written.begin(), written.end(), "chat_template.jinja") == written.end()
                    ? std::string("the source's")
                    : spec.conversation.template_name)
            << ")\n";
}

}  // namespace gmod::cli

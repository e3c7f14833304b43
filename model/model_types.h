// LLaMA-family model types named by other codebases' checkpoints that a module above model/ reads (a MoD method's
// original checkpoint layout, mod/token_selection.h). Registered by that module at static initialisation (a
// namespace-scope LlamaModelType), accepted by parse_model_config like "llama", so model/ names no method.
#pragma once

#include <string>

namespace gmod {

struct LlamaModelType {
  explicit LlamaModelType(const std::string& type);
};
bool is_registered_llama_model_type(const std::string& type);

}  // namespace gmod

// Loading and saving whole models as Hugging Face checkpoints (config.json + safetensors; PyTorch .bin read too).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint_files.h"
#include "model/hf_names.h"
#include "model/llava.h"

namespace gmod {

struct LoadOptions {
  // Parameters whose gmod names start with one of these may be absent from the checkpoint (they keep
  // their current values), e.g. "vision." for original LLaVA checkpoints that do not carry the tower.
  std::vector<std::string> optional_prefixes;
  // Load only what the file has (e.g. a stage-1 projector file over an LLM); still rejects unknown
  // names and wrong shapes.
  bool partial = false;
  // Checkpoint names gmod does not know are an error unless they start with one of these.
  std::vector<std::string> ignore_unknown_prefixes;
  // Checkpoint names for which this returns true are not loaded (reported in `unmapped`); the caller
  // loads them itself (e.g. the copies of a shared MoD router).
  std::function<bool(const std::string& hf_name)> skip;
};

struct LoadReport {
  std::vector<std::string> loaded;     // gmod names
  std::vector<std::string> missing;    // gmod names left untouched (allowed by the options)
  std::vector<std::string> unmapped;   // checkpoint names skipped (allowed by the options)
};

// Copies checkpoint tensors (a file, a directory, or a sharded index) into `model`, converting dtype.
// Errors name the checkpoint file and tensor: missing tensors, shape mismatches, unknown names.
LoadReport load_weights(MultimodalLM& model, const std::string& checkpoint, const LoadOptions& opt = {});
// The same from an opened checkpoint (a caller that reads more of it opens its files once).
LoadReport load_weights(MultimodalLM& model, const CheckpointFiles& checkpoint, const LoadOptions& opt = {});

// config.json + weights from a Hugging Face model directory; parameters in `dtype` on `device`.
std::shared_ptr<MultimodalLM> load_pretrained(const std::string& dir, at::ScalarType dtype = at::kFloat,
                                              at::Device device = at::kCPU, const LoadOptions& opt = {});

// Writes config.json + model.safetensors (sharded above `max_shard_bytes`) in the transformers
// layout: Qwen2_5_VLForConditionalGeneration for Qwen2.5-VL (published names), LlavaForConditionalGeneration when
// the model has another vision tower, else LlamaForCausalLM.
// `extra_tensors` (already HF-named) and `extra_config` fields are added as they are; parameters named
// in `skip_params` (gmod names) are not written (the caller writes them as extra tensors, renamed).
void save_pretrained(const MultimodalLM& model, const std::string& dir,
                     const std::vector<std::pair<std::string, at::Tensor>>& extra_tensors = {},
                     const std::string& extra_config_json = "{}", uint64_t max_shard_bytes = 2ull << 30,
                     const std::vector<std::string>& skip_params = {});

}  // namespace gmod

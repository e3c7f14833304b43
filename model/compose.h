// A LLaVA model composed from its parts, the way LLaVA's stage 2 starts: an LLM (Hugging Face LlamaForCausalLM
// directory, e.g. Vicuna-7B-v1.5), a CLIP vision tower (HF CLIPVisionModel or CLIPModel directory, e.g.
// clip-vit-large-patch14-336) and the stage-1 projector (`mm_projector.bin` written by torch.save, or a
// .safetensors file; LLaVA's `model.mm_projector.{0,2}.*` or transformers' `multi_modal_projector.linear_{1,2}.*`
// names). The LLM keeps its vocabulary: images use the placeholder id vocab_size (LLaVA's IMAGE_TOKEN_INDEX), whose
// positions are filled by projected image features and never embedded. Every problem of every part (missing or
// unknown tensors, shape mismatches between projector, tower and LLM, inconsistent image sizes) is reported in one
// error.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/llava.h"

namespace gmod {

struct ModelParts {
  std::string llm;        // HF LlamaForCausalLM directory (config.json + safetensors, single or sharded)
  std::string vision;     // HF CLIPVisionModel / CLIPModel directory ("" = a text-only LLM)
  std::string projector;  // stage-1 projector file ("" = initialised randomly, as at the start of stage 1)
  int vision_feature_layer = -2;                          // LLaVA-1.5: penultimate layer
  std::string vision_feature_select_strategy = "default";  // "default" drops CLS (LLaVA "patch"), "full" keeps it
  // LLaVA-HR (model/multipath_tower.h): a timm ConvNeXt directory (config.json with "architecture", weights in
  // timm's names) for the slow path; `vision` is then the fast CLIP path. The stage-1 projector file may also
  // hold the adapters (`model.vision_tower.align_stages*`, as LLaVA-HR's pretraining saves them).
  std::string vision_slow;
  int input_image_size = 1024;
  bool freeze_vision = true;  // LLaVA-HR's flag: false = the towers train and the stitch adapters exist
  // Mini-Gemini (model/mgm_tower.h): an OpenCLIP ConvNeXt directory (open_clip_config.json and
  // open_clip_model.safetensors or open_clip_pytorch_model.bin; its name decides the shape as in MGM, e.g.
  // openclip-convnext-large-d-320-laion2B-s29B-b131K-ft-soup) for the high-resolution path; `vision` is then the
  // low-resolution CLIP. The stage-1 file of MGM's pretraining holds the mining projectors (model.vlm_uni_*)
  // next to the projector; its copies of the frozen towers are not read (the towers come from their directories).
  std::string vision_aux;
  int image_size_aux = 768;
  int image_grid = 1;
  bool image_global = false;
  bool optimize_vision_tower = false;
  bool optimize_vision_tower_aux = false;
  // LLaVA-NeXT (model/anyres_grid.h): AnyRes tiling of `vision`'s input among these (height, width) resolutions,
  // spatial_unpad with the original LLaVA code's truncating rounding (the code LLaVA-NeXT, p-MoD and PyramidDrop
  // trained with), and the learned image_newline, initialised as LLaVA does (normal, std 1 / sqrt(hidden)).
  std::vector<std::array<int, 2>> image_grid_pinpoints;
};

// The composed model's config (LLM config + vision config + LLaVA wiring). Throws listing every problem.
LlavaConfig compose_model_config(const ModelParts& parts);

// Builds the model in `dtype` on `device` and loads every part. Without a projector file the projector is
// initialised as transformers does (normal(0, initializer_range) weights, zero biases) from `init_seed`.
std::shared_ptr<MultimodalLM> load_composed(const ModelParts& parts, at::ScalarType dtype = at::kFloat,
                                            at::Device device = at::kCPU, uint64_t init_seed = 0);

// The projector tensors of a stage-1 file under gmod names (projector.linear_{1,2}.{weight,bias}, LLaVA-HR's
// adapters as vision.align_stages*, MGM's mining projectors as vision.mining.vlm_uni_*); unknown or missing names
// are appended to `problems`. MGM's copies of its frozen towers (model.vision_tower*.*) are skipped.
std::vector<std::pair<std::string, at::Tensor>> read_projector(const std::string& path,
                                                               std::vector<std::string>& problems);

// The directory holding the image preprocessor config for a composed model (the vision part), or "".
std::string parts_preprocessor_dir(const ModelParts& parts);

}  // namespace gmod

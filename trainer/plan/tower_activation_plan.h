// The memory plan's vision-tower activation terms (trainer/plan/memory_plan.h): what a trained tower's
// forward saves for its backward, with and without checkpointing the tower's units, and what its own backward
// adds on top. Each count mirrors the code it stands for: model/clip.cpp (CLIP encoder layer), and for
// LLaVA-HR model/multipath_tower.cpp (fast path head, quarters, adapters), model/convnext.cpp (stem, stages,
// blocks), model/mr_adapters.cpp (stitch and align modules), model/unit_checkpoint.h (a checkpointed unit
// keeps its input). Validated against measured peaks of real training steps
// (tests/trainer/mpi_memory_plan_hr_test.cpp).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace gmod {

// Bytes one CLIP encoder layer saves for the backward on NT tokens (width Dv, MLP Iv, `heads` heads; `e`
// bytes per element): layer_norm1 input + mean/rstd, q/k/v projections' input, SDPA's q, k, v, output and
// log-sum-exp, out_proj input, layer_norm2 input + stats, fc1 input, quick_gelu's input and sigmoid, fc2
// input.
int64_t clip_layer_activations(int64_t NT, int64_t Dv, int64_t Iv, int64_t heads, int64_t e);

struct TowerActivations {
  int64_t saved = 0;          // saved for the backward, alive at the end of the forward
  int64_t backward_peak = 0;  // the tower's bytes at the worst point of its own backward (saved tensors not
                              // yet released, a recomputed unit, gradients inside it)
  int64_t largest_unit = 0;   // the largest checkpoint unit's activations (recomputed in the backward)
};

// The kernels that run a tower's convolutions and their backward, where their temporaries differ (bf16 only):
// CUDA; on the CPU oneDNN's bf16 kernels (AVX-512 and up) or ATen's own (AVX2: model/cpu_kernels.h).
enum class ConvKernels { kCuda, kCpuOneDnn, kCpuAten };

// LLaVA-HR's multipath tower (c.multipath, fast path c.vision) with trained towers on `images` images; with
// `checkpointing` every CLIP layer and ConvNeXt stage keeps only its input and is recomputed in the backward
// (what gmod train does whenever model.activation_checkpointing is not none). `kernels`: who runs the convolutions
// (in bf16 their backward's temporaries differ; ConvKernels).
TowerActivations multipath_tower_activations(const LlavaConfig& c, int64_t images, int64_t e,
                                             bool checkpointing, ConvKernels kernels);

// Mini-Gemini (c.mgm): the patch info mining's saved tensors on `images` images (the regions, both LayerNorm
// outputs, the scaled keys and the values, the softmax), and with trained towers the CLIP layers on every crop and
// the aux ConvNeXt at image_size_aux (LLaVA-HR's 12 C per pixel per block), or with checkpointing their unit
// inputs plus the largest unit. An estimate from the code, not yet checked against a measured peak.
int64_t mgm_tower_activations(const LlavaConfig& c, int64_t images, int64_t e, bool train_towers,
                              bool checkpointing);

}  // namespace gmod

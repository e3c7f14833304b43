// Loading a timm ConvNeXt checkpoint (e.g. timm/convnext_large_mlp.clip_laion2b_ft_320's model.safetensors,
// names stem.0.weight, stages.i.blocks.j.gamma, head.*) into gmod's ConvNext, also with LLaVA-HR's
// layer-scale name (`blocks.j.weight`) and under a prefix. The classifier head and norm_pre are skipped (not
// held).
#pragma once

#include <string>

#include "model/convnext.h"

namespace gmod {

// Copies every tensor of `checkpoint` (safetensors file, directory or sharded index, or a torch.save `.bin` such as
// open_clip's open_clip_pytorch_model.bin) whose name starts with `prefix` into
// `net`. Throws one error listing every problem: tensors the net lacks, missing tensors, wrong shapes.
void load_convnext_weights(ConvNext& net, const std::string& checkpoint, const std::string& prefix = "");

}  // namespace gmod

#pragma once
// gmod's fp32 is IEEE fp32 everywhere. LibTorch leaves TF32 off for cuBLAS matmuls but allows it for cuDNN
// convolutions by default (CLIP's patch embedding, LLaVA-HR's ConvNeXt), which would make an fp32 run on a
// GPU round its convolutions to 10-bit mantissas. use_ieee_fp32() turns TF32 off for cuBLAS, cuDNN
// convolutions and RNNs; every gmod command calls it at start (launch/main.cpp), and the CUDA parity tests do
// too. bf16 is unaffected (TF32 applies to fp32 operands only).
namespace gmod {

void use_ieee_fp32();
// True when no CUDA fp32 matmul, convolution or RNN may use TF32.
bool ieee_fp32_in_force();

}  // namespace gmod

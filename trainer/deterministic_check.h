#pragma once
// `deterministic: true` on CUDA makes LibTorch throw, mid-step, at the first operation that has no
// deterministic CUDA kernel. Two of gmod's paths may reach one, depending on the LibTorch build: the backward
// of a bilinear resize (LLaVA-HR's align_grid and Mini-Gemini's global crop when their ConvNeXt trains) and a
// floating-point cumsum (A-MoD's causal column normalisation, `mod.amod_causal_normalise`). The trainer asks
// this device once, at start, whether each op runs under the current deterministic setting, and refuses a run
// that would reach one that does not with a named error, before any step or checkpoint.
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace gmod {

struct DeterministicUse {
  std::string site;  // where the run reaches the op ("" when it does not)
  std::string op;    // "bilinear resize backward", "float cumsum"
  bool runs = true;  // the op runs on this device under the current deterministic setting
  std::string remedy = "freeze.vision";  // the setting that avoids it, for the message
};

// The named error for the uses that are reached and do not run (one line each, with what to change), or "".
std::string deterministic_conflicts(const std::vector<DeterministicUse>& uses);

// Whether a tiny bilinear resize forward + backward / a float cumsum forward + backward run on `device` under
// the current at::globalContext() deterministic setting (true on the CPU, where both are deterministic).
bool bilinear_backward_runs(const at::Device& device);
bool float_cumsum_runs(const at::Device& device);
// By the op's name in DeterministicUse ("bilinear resize backward", "float cumsum"); std::invalid_argument otherwise.
bool deterministic_op_runs(const std::string& op, const at::Device& device);

}  // namespace gmod

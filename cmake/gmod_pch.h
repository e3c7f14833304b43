// The headers nearly every gmod translation unit parses, compiled once per build into a precompiled header (target
// gmod_pch, cmake/Precompiled.cmake) that every library, executable and benchmark reuses; tests reuse
// cmake/gmod_pch_test.h's. These are LibTorch's tensor, module and autograd headers, not the whole <torch/torch.h>:
// measured on one translation unit (mod/mod_layer.cpp, GCC 12, -O2 -g1), 14.6 s of CPU without a precompiled
// header, 7.9 s with this one, 12.7 s with all of <torch/torch.h> precompiled (a larger artifact to load, and more
// to instantiate in every unit). Add a header here only if most translation units include it anyway: every change
// here rebuilds everything.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

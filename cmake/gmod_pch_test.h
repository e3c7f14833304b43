// The precompiled header of the GoogleTest binaries (target gmod_pch_test, cmake/Precompiled.cmake): the product's
// (cmake/gmod_pch.h), plus GoogleTest and all of <torch/torch.h>, which most test files include through
// tests/*/..._util.h (measured on tests/mod/test_routing_rule.cpp: 29.5 s of CPU without, 18.5 s with <torch/torch.h>
// precompiled, 20.7 s with the product's header only).
#pragma once

#include "cmake/gmod_pch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

// `deterministic: true` on CUDA is refused at start when the run would reach an op without a deterministic
// CUDA kernel (trainer/deterministic_check.h): the towers say when their bilinear resize is differentiated
// (only with a trained ConvNeXt), and the error names each site reached. The device probes are checked where
// they can be: on the CPU (always runs) and, with a GPU, against what LibTorch does.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <iostream>

#include "model/pretrained.h"
#include "tests/common/paths.h"
#include "trainer/deterministic_check.h"

using namespace gmod;

TEST(DeterministicCheck, NamesEveryReachedSiteThatCannotRun) {
  EXPECT_EQ(deterministic_conflicts({}), "");
  EXPECT_EQ(
      deterministic_conflicts({{"", "bilinear resize backward", false}, {"A-MoD", "float cumsum", true}}),
      "");
  const std::string e = deterministic_conflicts({{"the tower's resize", "bilinear resize backward", false},
                                                 {"A-MoD's normalisation", "float cumsum", false}});
  EXPECT_NE(e.find("the tower's resize: the bilinear resize backward"), std::string::npos) << e;
  EXPECT_NE(e.find("A-MoD's normalisation: the float cumsum"), std::string::npos) << e;
  EXPECT_NE(e.find("deterministic: false"), std::string::npos) << e;
}

TEST(DeterministicCheck, TowersReportTheirResizeOnlyWhenTheConvNextTrains) {
  for (const char* dir : {"llava_hr/hr384_frozen", "mgm/base_frozen"}) {
    auto model = load_pretrained(test::fixture(dir));
    ASSERT_TRUE(model->vision) << dir;
    for (auto& p : model->parameters()) p.set_requires_grad(false);
    EXPECT_EQ(model->vision->differentiated_bilinear_resize(), "") << dir;
    // Everything but the ConvNeXt trains: the resize's input still needs no gradient.
    for (auto& item : model->named_parameters())
      item.value().set_requires_grad(item.key().find("slow_vision_tower") == std::string::npos &&
                                     item.key().find("vision_tower_aux") == std::string::npos);
    EXPECT_EQ(model->vision->differentiated_bilinear_resize(), "") << dir;
    for (auto& p : model->parameters()) p.set_requires_grad(true);
    EXPECT_NE(model->vision->differentiated_bilinear_resize().find("ConvNeXt"), std::string::npos) << dir;
  }
  auto clip_only = load_pretrained(test::fixture("hf/llava_layer_m2"));
  EXPECT_EQ(clip_only->vision->differentiated_bilinear_resize(), "");  // CLIP resizes nothing
}

TEST(DeterministicCheck, ProbesAgreeWithLibTorch) {
  EXPECT_TRUE(bilinear_backward_runs(at::Device(at::kCPU)));
  EXPECT_TRUE(float_cumsum_runs(at::Device(at::kCPU)));
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (the CPU probes were checked)";
  auto& ctx = at::globalContext();
  const bool was = ctx.deterministicAlgorithms();
  ctx.setDeterministicAlgorithms(true, false);
  const at::Device cuda(at::kCUDA, 0);
  const bool bilinear = bilinear_backward_runs(cuda), cumsum = float_cumsum_runs(cuda);
  auto x = at::rand({2, 3, 5, 5}, at::TensorOptions().device(cuda)).requires_grad_(true);
  bool threw = false;
  try {
    at::upsample_bilinear2d(x, {9, 9}, true).sum().backward();
  } catch (const std::exception&) {
    threw = true;
  }
  EXPECT_EQ(bilinear, !threw);
  std::cout << "[ deterministic CUDA ] bilinear resize backward " << (bilinear ? "runs" : "throws")
            << ", float cumsum " << (cumsum ? "runs" : "throws") << "\n";
  ctx.setDeterministicAlgorithms(was, false);
}

// The γ-MoD fixture made by the original Gamma-MOD modules (tests/fixtures/make_gamma_mod_fixtures.py,
// gamma_mod/llava_clip_mod12): its stored inputs as gmod's ModelInputs and a training forward that records each MoD
// layer's selection. Shared by test_original_saves.cpp and test_gamma_mod_short_sequence.cpp.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/llava.h"
#include "model/safetensors.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "tests/common/paths.h"

namespace gmod::test::gamma_mod_ref {

constexpr int64_t kImageMarker = -200;

inline std::string fixture_dir() { return test::fixture("gamma_mod/llava_clip_mod12"); }

inline double logit_tolerance(const at::Tensor& ref) { return 1e-5 * std::max(1.0, ref.abs().max().item<double>()); }

inline ModelInputs reference_inputs(const SafetensorsFile& ref, int64_t image_id, int repeat) {
  ModelInputs in;
  auto ids = ref.tensor("input.input_ids");
  in.input_ids = ids.masked_fill(ids == kImageMarker, image_id);
  in.labels = ref.tensor("input.labels").clone();
  in.token_roles = ref.tensor("input.token_roles").to(at::kChar);
  if (ref.has("input.pixels_lowres"))
    in.pixel_values = ref.tensor("input.pixels_lowres").repeat_interleave(repeat, 2).repeat_interleave(repeat, 3);
  in.attention_mask = at::ones_like(in.input_ids, at::kBool);
  return in;
}

struct Run {
  ModelOutput out;
  at::Tensor routing;
  std::vector<at::Tensor> selected;  // per MoD layer, [B, L] bool
};

inline Run train_forward(MultimodalLM& model, const ModelInputs& in, const MoDConfig& mc) {
  model.train();
  auto layers = mod_layers(model);
  for (auto& l : layers) {
    l->record_selection = true;
    l->recorded.clear();
  }
  Run r;
  ForwardState st;
  r.out = model.forward(in, st);
  r.routing = total_routing_loss(st, mc);
  for (auto& l : layers) r.selected.push_back(l->recorded.at(0));
  return r;
}

}  // namespace gmod::test::gamma_mod_ref

#include "trainer/plan/tower_activation_plan.h"

#include <algorithm>

namespace gmod {

int64_t clip_layer_activations(int64_t NT, int64_t Dv, int64_t Iv, int64_t heads, int64_t e) {
  return e * NT * (Dv * 8 + 3 * Iv) + 8 * NT * 2 + 4 * NT * heads;
}

TowerActivations multipath_tower_activations(const LlavaConfig& c, int64_t N, int64_t e, bool ckpt,
                                             ConvKernels kernels) {
  const MultipathConfig& m = *c.multipath;
  const ClipVisionConfig& v = *c.vision;
  const ConvNextConfig& cn = m.slow;
  const int64_t F = m.fast_image_size(), g = F / v.patch_size, T = g * g, D = v.hidden_size, NT = N * T;

  // In forward order: what runs outside the checkpoint units, then the units. The tower's backward visits
  // them in reverse (align, CLIP layers and stitches, ConvNeXt stages), each freeing what it saved. Fast path
  // head: the patch conv's input (the image resized to F px), pre_layrnorm's input (the embeddings with the
  // class position: the narrow that drops it is a view) and its mean/rstd. ConvNeXt stem: LayerNorm2d's input
  // (the patch conv's output) and its statistics.
  int64_t side = m.input_image_size / cn.patch_size;
  int64_t px = N * side * side;
  const int64_t head = e * N * 3 * F * F + e * N * (T + 1) * D + 8 * NT + e * px * cn.dims[0] + 8 * px;

  // ConvNeXt stages. A block saves dwconv's input, LayerNorm's input, fc1's input, GELU's input (4C), fc2's
  // input (4C), the layer-scale product's input: 12 C per pixel, plus LayerNorm's mean/rstd; a downsampling
  // stage saves its LayerNorm2d's input and statistics and the 2x2 conv's input, at the previous stage's
  // resolution. A block's backward holds about 6 C per pixel on top: the incoming gradient, the recomputed
  // output, and the gradients of the 4C-wide MLP activations while the ones they replace are released. On the
  // CPU in bf16 the convolutions' backward adds temporaries that depend on who runs them:
  //  - oneDNN's bf16 kernels (AVX-512 and up): about 44 bytes more per pixel and channel (measured on the stem
  //    and stage 0 alone: 57 bytes against 20 in fp32; a profile of one block shows it as one large allocation
  //    in its backward);
  //  - ATen's own kernels (AVX2, where oneDNN has no bf16): the depthwise convolution runs group by group through
  //    the im2col convolution, whose backward (as we read ATen's source; the allocations were not traced) keeps
  //    every group's input gradient for the final concatenation
  //    (C per pixel, then the concatenated copy: 2 e C) and, one group at a time, two 7x7 column buffers: the
  //    im2col of the group's input (for the weight gradient) and the columns col2im turns into its input gradient
  //    (2 x 49 e per pixel). With one buffer the plan was 0.86 MiB (= 49 e per pixel of stage 0) under the peak
  //    measured on AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) by tests/trainer/mpi_memory_plan_hr_test.cpp; with two, equal.
  //    The per-channel part is an upper bound on this path: with wider stages (dims 24-48) the plan is 20.6% over
  //    the AVX2 peak (a profile of one block in bf16 on ATen's kernels holds about as many elements as in fp32,
  //    i.e. less than the 6 C + 2 C counted here), the safe direction for "fits".
  int64_t block_bwd = 6 * e, block_bwd_px = 0;
  if (e == 2 && kernels == ConvKernels::kCpuOneDnn) block_bwd += 44;
  if (e == 2 && kernels == ConvKernels::kCpuAten) block_bwd += 2 * e, block_bwd_px = 2 * 49 * e;
  int64_t slow_saved = 0, unit_max = 0, peak = 0;
  int64_t prev_px = px, prev_c = cn.dims[0];
  for (size_t i = 0; i < cn.dims.size(); ++i) {
    if (i > 0) side /= 2;
    const int64_t p = N * side * side, C = cn.dims[i];
    int64_t full = int64_t(cn.depths[i]) * (12 * e * p * C + 8 * p);
    if (i > 0 || prev_c != C) full += 2 * e * prev_px * prev_c + 8 * prev_px;
    const int64_t input = e * prev_px * prev_c;  // what a checkpointed stage keeps
    unit_max = std::max(unit_max, full);
    peak = std::max(peak, head + slow_saved + (ckpt ? input : 0) + full + block_bwd * p * C + block_bwd_px * p);
    slow_saved += ckpt ? input : full;
    prev_px = p, prev_c = C;
  }
  const int64_t slow_px = prev_px, C3 = prev_c, L3 = slow_px / N;

  // CLIP layers: all of them run (the four quarters).
  const int64_t n = v.num_hidden_layers;
  const int64_t layer = clip_layer_activations(NT, D, v.intermediate_size, v.num_attention_heads, e);
  unit_max = std::max(unit_max, layer);
  const int64_t clip_saved = ckpt ? n * e * NT * D : n * layer;
  // Stitches (trained towers): the slow map (saved by slow_conv, shared by the three), the slow branch's GELU
  // and slow_proj inputs on the slow grid, the slow features on the fast grid (saved by the gated product;
  // average pooling from a larger slow grid also saves its input), the fast branch's depthwise conv, GELU and
  // fast_proj inputs.
  int64_t stitches = e * slow_px * C3;
  if (m.stitch)
    stitches += 3 * (2 * e * slow_px * C3 + e * NT * D + (L3 > T ? e * N * L3 * D : 0) + 3 * e * NT * D);
  // Align module: fast_proj's input (the last CLIP layer's output) and slow_proj's input (the slow map on the
  // fast grid, a contiguous copy).
  const int64_t align = e * NT * D + e * NT * C3;

  TowerActivations a;
  a.largest_unit = unit_max;
  a.saved = head + slow_saved + clip_saved + stitches + align;
  // The last CLIP layer's backward (align done, everything else alive): its activations (recomputed when
  // checkpointed) and the gradients of its MLP and attention inputs.
  const int64_t clip_peak = a.saved - align + (ckpt ? layer : 0) + e * NT * (2 * v.intermediate_size + 2 * D);
  a.backward_peak = std::max(peak, clip_peak);
  return a;
}

int64_t mgm_tower_activations(const LlavaConfig& c, int64_t images, int64_t e, bool train_towers,
                              bool checkpointing) {
  const auto& m = *c.mgm;
  const auto& v = *c.vision;
  const int64_t T = c.image_seq_length(), Dv = v.hidden_size, a = m.aux_channels();
  const int64_t region = m.image_size_aux / m.aux.patch_size / m.image_grid / (v.image_size / v.patch_size);
  const int64_t pp = region * region;
  const int64_t n = e * images * T * pp * (3 * a + 2 * Dv + 1) + e * images * T * 4 * Dv;
  if (!train_towers) return n;
  const int64_t crops = images * m.clip_images(), Tc = v.num_patches() + 1;
  const int64_t clip_layer = clip_layer_activations(crops * Tc, Dv, v.intermediate_size, v.num_attention_heads, e);
  int64_t full = int64_t(v.num_hidden_layers) * clip_layer;
  int64_t kept = int64_t(v.num_hidden_layers) * e * crops * Tc * Dv;
  int64_t unit_max = clip_layer, side = m.image_size_aux / m.aux.patch_size;
  for (size_t i = 0; i < m.aux.dims.size(); ++i) {
    if (i > 0) side /= 2;
    const int64_t px = images * side * side, C = m.aux.dims[i];
    const int64_t stage = e * px * C * (12 * m.aux.depths[i] + (i > 0 ? 2 : 0));
    full += stage;
    kept += e * px * C;
    unit_max = std::max(unit_max, stage);
  }
  return n + (checkpointing ? kept + unit_max : full);
}

}  // namespace gmod

#include "model/qwen3_vl_vision.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/module_group.h"
#include "model/qwen2_5_vl_vision.h"
#include "model/unit_checkpoint.h"
#include "model/unit_hooks.h"

namespace gmod {

namespace {

// The two taps along one axis of `size` patches resampled from `side` grid points (align_corners): source
// coordinate i * (side - 1) / max(size - 1, 1) in fp32, taps floor and floor + 1 clamped to the grid, weights
// 1 - distance (clamped at 0).
void axis_taps(int64_t i, int64_t size, int64_t side, int64_t tap[2], float w[2]) {
  const float src = static_cast<float>(i) * static_cast<float>(side - 1) / static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    tap[o] = std::clamp<int64_t>(static_cast<int64_t>(fl) + o, 0, side - 1);
    w[o] = std::max(1.0f - std::fabs(src - fl - static_cast<float>(o)), 0.0f);
  }
}

}  // namespace

Qwen3VisionPositions Qwen3VisionPositions::of(const at::Tensor& grid_thw, const Qwen3VisionConfig& c) {
  if (grid_thw.dim() != 2 || grid_thw.size(1) != 3)
    throw std::invalid_argument("Qwen3-VL vision: grid_thw must be [n, 3], got " + std::to_string(grid_thw.dim()) +
                                "-D");
  auto g = grid_thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* gp = g.data_ptr<int64_t>();
  const int64_t m = c.spatial_merge_size, side = c.grid_side();
  std::vector<int64_t> taps, rc;
  std::vector<float> weights;
  Qwen3VisionPositions out;
  for (int64_t e = 0; e < g.size(0); ++e) {
    const int64_t t = gp[3 * e], h = gp[3 * e + 1], w = gp[3 * e + 2];
    if (t <= 0 || h <= 0 || w <= 0 || h % m || w % m)
      throw std::invalid_argument("Qwen3-VL vision: grid_thw row " + std::to_string(e) + " (" + std::to_string(t) +
                                  ", " + std::to_string(h) + ", " + std::to_string(w) +
                                  ") must be positive with h and w multiples of spatial_merge_size " +
                                  std::to_string(m));
    for (int64_t f = 0; f < t; ++f) {
      // Patches in the processor's order: merge blocks row-major, patches row-major inside each block.
      for (int64_t bi = 0; bi < h / m; ++bi)
        for (int64_t bj = 0; bj < w / m; ++bj)
          for (int64_t a = 0; a < m; ++a)
            for (int64_t b = 0; b < m; ++b) {
              const int64_t r = bi * m + a, col = bj * m + b;
              int64_t rt[2], ct[2];
              float rw[2], cw[2];
              axis_taps(r, h, side, rt, rw);
              axis_taps(col, w, side, ct, cw);
              for (int p = 0; p < 2; ++p)
                for (int q = 0; q < 2; ++q) taps.push_back(rt[p] * side + ct[q]), weights.push_back(rw[p] * cw[q]);
              rc.push_back(r), rc.push_back(col);
            }
      out.frame_lengths.push_back(h * w);
    }
  }
  out.taps = at::tensor(taps, at::kLong).view({-1, 4});
  out.weights = at::tensor(weights, at::kFloat).view({-1, 4});
  out.rows_cols = at::tensor(rc, at::kLong).view({-1, 2});
  return out;
}

Qwen3VisionBlock::Qwen3VisionBlock(const Qwen3VisionConfig& c)
    : n_heads(c.num_heads), head_dim(c.head_dim()), tanh_gelu(c.hidden_act == "gelu_pytorch_tanh") {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  norm1 = register_module("norm1", std::make_shared<LayerNormImpl>(d, 1e-6));
  norm2 = register_module("norm2", std::make_shared<LayerNormImpl>(d, 1e-6));
  attn = register_module("attn", std::make_shared<ModuleGroup>());
  qkv = attn->register_module("qkv", std::make_shared<LinearImpl>(d, 3 * d, true));
  proj = attn->register_module("proj", std::make_shared<LinearImpl>(d, d, true));
  mlp = register_module("mlp", std::make_shared<ModuleGroup>());
  fc1 = mlp->register_module("linear_fc1", std::make_shared<LinearImpl>(d, f, true));
  fc2 = mlp->register_module("linear_fc2", std::make_shared<LinearImpl>(f, d, true));
}

at::Tensor Qwen3VisionBlock::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const std::vector<int64_t>& segments) {
  const int64_t n = x.size(0), d = x.size(1);
  auto qkv_ = qkv->forward(norm1->forward(x)).view({n, 3, n_heads, head_dim});
  // Rotary in fp32 on [N, H, Dh], cast back to the activation dtype.
  auto rot = [&](const at::Tensor& t) {
    auto f = t.to(at::kFloat);
    auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
    return (f * c + vision_rotate_half(f) * s).to(x.scalar_type());
  };
  auto q = rot(qkv_.select(1, 0)), k = rot(qkv_.select(1, 1)), v = qkv_.select(1, 2);
  const auto out = vision_segment_attention(q, k, v, segments, 1.0 / std::sqrt(static_cast<double>(head_dim)),
                                            "Qwen3-VL vision block");
  auto h = x + proj->forward(out.reshape({n, d}));
  auto y = fc1->forward(norm2->forward(h));
  return h + fc2->forward(tanh_gelu ? at::gelu(y, "tanh") : at::gelu(y));
}

Qwen3VisionMerger::Qwen3VisionMerger(const Qwen3VisionConfig& c, bool post)
    : unit(c.merge_unit()), postshuffle(post) {
  const int64_t wide = c.hidden_size * unit;
  norm = register_module("norm", std::make_shared<LayerNormImpl>(post ? wide : c.hidden_size, 1e-6));
  fc1 = register_module("linear_fc1", std::make_shared<LinearImpl>(wide, wide, true));
  fc2 = register_module("linear_fc2", std::make_shared<LinearImpl>(wide, c.out_hidden_size, true));
}

at::Tensor Qwen3VisionMerger::forward(const at::Tensor& h) {
  const auto shape = std::vector<int64_t>{h.size(0) / unit, unit * h.size(1)};
  auto x = postshuffle ? norm->forward(h.reshape(shape)) : norm->forward(h).reshape(shape);
  return fc2->forward(at::gelu(fc1->forward(x)));
}

Qwen3VisionEncoder::Qwen3VisionEncoder(const Qwen3VisionConfig& c) : config(c) {
  auto pe = register_module("patch_embed", std::make_shared<ModuleGroup>());
  auto pr = pe->register_module("proj", std::make_shared<ModuleGroup>());
  patch_weight = pr->register_parameter(
      "weight", at::empty({c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  patch_bias = pr->register_parameter("bias", at::empty({c.hidden_size}));
  auto pos = register_module("pos_embed", std::make_shared<ModuleGroup>());
  pos_embed = pos->register_parameter("weight", at::empty({c.num_position_embeddings, c.hidden_size}));
  auto list = register_module("blocks", std::make_shared<ModuleGroup>());
  for (int64_t i = 0; i < c.depth; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<Qwen3VisionBlock>(c)));
  merger = register_module("merger", std::make_shared<Qwen3VisionMerger>(c, false));
  auto ds = register_module("deepstack_merger_list", std::make_shared<ModuleGroup>());
  for (size_t j = 0; j < c.deepstack_visual_indexes.size(); ++j)
    deepstack_mergers.push_back(ds->register_module(std::to_string(j), std::make_shared<Qwen3VisionMerger>(c, true)));
}

at::Tensor Qwen3VisionEncoder::features(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                        std::vector<at::Tensor>* deepstack) {
  const auto& c = config;
  if (pixel_values.dim() != 2 || pixel_values.size(1) != c.patch_dim())
    throw std::invalid_argument("Qwen3-VL vision: pixel_values must be [N, " + std::to_string(c.patch_dim()) +
                                "] (C * temporal_patch_size * patch_size^2), got " +
                                std::to_string(pixel_values.dim()) + "-D with " +
                                std::to_string(pixel_values.size(-1)) + " columns");
  const auto layout = Qwen3VisionPositions::of(grid_thw, c);
  const int64_t n = pixel_values.size(0), d = c.hidden_size;
  if (layout.rows_cols.size(0) != n)
    throw std::invalid_argument("Qwen3-VL vision: grid_thw covers " + std::to_string(layout.rows_cols.size(0)) +
                                " patches but pixel_values has " + std::to_string(n));
  const auto dev = pixel_values.device();
  // The published Conv3d (stride = kernel) over each patch viewed as [C, T, P, P]: one output per patch.
  auto h = at::conv3d(pixel_values.to(patch_weight.scalar_type())
                          .view({n, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}),
                      patch_weight, patch_bias, {c.temporal_patch_size, c.patch_size, c.patch_size})
               .view({n, d});
  // Learned positions: the four grid taps of each patch, weighted (fp32 weights, promoted as transformers) and
  // summed.
  auto pos = (at::embedding(pos_embed, layout.taps.to(dev)) * layout.weights.to(dev).unsqueeze(-1)).sum(1);
  h = h + pos.to(h.scalar_type());
  // 2-D rotary: the first half of the frequencies turn with the row, the second half with the column.
  auto inv = RotaryEmbedding(c.head_dim() / 2, c.rope_theta).inv_freq(dev);     // [Dh/4]
  auto ang = layout.rows_cols.to(dev).to(at::kFloat).unsqueeze(-1) * inv;       // [N, 2, Dh/4]
  auto cs = ang.cos().reshape({n, -1}), sn = ang.sin().reshape({n, -1});        // [N, Dh/2]: rows, then columns
  auto cos = at::cat({cs, cs}, -1), sin = at::cat({sn, sn}, -1);
  for (int64_t i = 0; i < c.depth; ++i) {
    auto block = blocks[static_cast<size_t>(i)];
    const auto& segments = layout.frame_lengths;
    auto run = [block, cos, sin, segments](const at::Tensor& x) { return block->forward(x, cos, sin, segments); };
    h = run_unit(*block, [&] {
      return checkpoint_units_
                 ? checkpointed_unit(run, h, block->parameters(), "Qwen3-VL vision block " + std::to_string(i))
                 : run(h);
    });
    const auto& idx = c.deepstack_visual_indexes;
    const auto at_ = std::find(idx.begin(), idx.end(), i);
    if (deepstack && at_ != idx.end()) {
      auto ds = deepstack_mergers[static_cast<size_t>(at_ - idx.begin())];
      deepstack->push_back(run_unit(*ds, [&] { return ds->forward(h); }));
    }
  }
  if (deepstack) {  // in deepstack_visual_indexes' order (the LLM layer each feeds), whatever the blocks' order
    std::vector<at::Tensor> ordered(c.deepstack_visual_indexes.size());
    std::vector<int64_t> sorted = c.deepstack_visual_indexes;
    std::sort(sorted.begin(), sorted.end());
    const size_t first = deepstack->size() - ordered.size();
    for (size_t j = 0; j < ordered.size(); ++j) {
      const auto rank = std::find(sorted.begin(), sorted.end(), c.deepstack_visual_indexes[j]) - sorted.begin();
      ordered[j] = (*deepstack)[first + static_cast<size_t>(rank)];
    }
    deepstack->resize(first);
    deepstack->insert(deepstack->end(), ordered.begin(), ordered.end());
  }
  return run_unit(*merger, [&] { return merger->forward(h); });
}

at::Tensor Qwen3VisionEncoder::features(const at::Tensor& pixel_values) {
  (void)pixel_values;
  throw std::invalid_argument("Qwen3-VL vision: features need each image's grid_thw (ModelInputs::image_grid_thw)");
}

}  // namespace gmod

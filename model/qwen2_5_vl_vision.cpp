#include "model/qwen2_5_vl_vision.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "model/module_group.h"
#include "model/safetensors.h"
#include "model/unit_checkpoint.h"
#include "model/unit_hooks.h"

namespace gmod {

at::Tensor vision_rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

at::Tensor vision_segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::vector<int64_t>& segments, double scale, const std::string& who) {
  const int64_t n = q.size(0), n_heads = q.size(1), head_dim = q.size(2);
  // Segments of equal length run as one batch (gathered, then put back).
  std::map<int64_t, std::vector<int64_t>> starts_by_len;
  int64_t at_ = 0;
  for (auto len : segments) {
    if (len > 0) starts_by_len[len].push_back(at_);
    at_ += len;
  }
  if (at_ != n)
    throw std::logic_error(who + ": segments cover " + std::to_string(at_) + " of " + std::to_string(n) +
                           " patches");
  at::Tensor out;
  if (starts_by_len.size() == 1 && starts_by_len.begin()->second.size() == 1) {
    auto split = [&](const at::Tensor& t) { return t.transpose(0, 1).unsqueeze(0); };  // [1, H, N, Dh]
    out = at::scaled_dot_product_attention(split(q), split(k), split(v), {}, 0.0, false, scale)
              .squeeze(0)
              .transpose(0, 1);
  } else {
    out = at::zeros({n, n_heads, head_dim}, q.options());
    for (const auto& [len, starts] : starts_by_len) {
      const int64_t g = static_cast<int64_t>(starts.size());
      auto idx =
          at::arange(len, at::kLong).unsqueeze(0) + at::tensor(starts, at::kLong).unsqueeze(1);  // [G, len]
      idx = idx.flatten().to(q.device());
      auto gather = [&](const at::Tensor& t) {  // [G, H, len, Dh]
        return t.index_select(0, idx).view({g, len, n_heads, head_dim}).transpose(1, 2);
      };
      auto a = at::scaled_dot_product_attention(gather(q), gather(k), gather(v), {}, 0.0, false, scale);
      out = out.index_copy(0, idx, a.transpose(1, 2).reshape({g * len, n_heads, head_dim}));
    }
  }
  return out;
}

Qwen25VisionLayout Qwen25VisionLayout::of(const at::Tensor& grid_thw, const Qwen25VisionConfig& c) {
  if (grid_thw.dim() != 2 || grid_thw.size(1) != 3)
    throw std::invalid_argument("Qwen2.5-VL vision: grid_thw must be [n, 3], got " +
                                std::to_string(grid_thw.dim()) + "-D");
  auto g = grid_thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* gp = g.data_ptr<int64_t>();
  const int64_t m = c.spatial_merge_size, v = c.window_units(), unit = c.merge_unit();
  std::vector<int64_t> order, pos;
  Qwen25VisionLayout out;
  int64_t base = 0;  // merge blocks before this grid entry
  for (int64_t e = 0; e < g.size(0); ++e) {
    const int64_t t = gp[3 * e], h = gp[3 * e + 1], w = gp[3 * e + 2];
    if (t <= 0 || h <= 0 || w <= 0 || h % m || w % m)
      throw std::invalid_argument("Qwen2.5-VL vision: grid_thw row " + std::to_string(e) + " (" +
                                  std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) +
                                  ") must be positive with h and w multiples of spatial_merge_size " +
                                  std::to_string(m));
    const int64_t lh = h / m, lw = w / m;
    // Patch (row, column) in the processor's order: merge blocks row-major, patches row-major inside each
    // block.
    for (int64_t f = 0; f < t; ++f) {
      for (int64_t bi = 0; bi < lh; ++bi)
        for (int64_t bj = 0; bj < lw; ++bj)
          for (int64_t a = 0; a < m; ++a)
            for (int64_t b = 0; b < m; ++b) pos.push_back(bi * m + a), pos.push_back(bj * m + b);
      out.frame_lengths.push_back(h * w);
      // Windows of v x v merge blocks, row-major over the frame; the last row/column of windows may be
      // narrower.
      for (int64_t wi = 0; wi < lh; wi += v)
        for (int64_t wj = 0; wj < lw; wj += v) {
          int64_t count = 0;
          for (int64_t r = wi; r < std::min(wi + v, lh); ++r)
            for (int64_t col = wj; col < std::min(wj + v, lw); ++col, ++count)
              order.push_back(base + f * lh * lw + r * lw + col);
          out.window_lengths.push_back(count * unit);
        }
    }
    base += t * lh * lw;
  }
  out.window_index = at::tensor(order, at::kLong);
  out.unwindow = at::argsort(out.window_index);
  out.positions = at::tensor(pos, at::kLong).view({-1, 2});
  return out;
}

Qwen25VisionBlock::Qwen25VisionBlock(const Qwen25VisionConfig& c)
    : n_heads(c.num_heads), head_dim(c.head_dim()), silu(c.hidden_act == "silu") {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  norm1 = register_module("norm1", std::make_shared<RMSNormImpl>(d, 1e-6));
  norm2 = register_module("norm2", std::make_shared<RMSNormImpl>(d, 1e-6));
  attn = register_module("attn", std::make_shared<ModuleGroup>());
  qkv = attn->register_module("qkv", std::make_shared<LinearImpl>(d, 3 * d, true));
  proj = attn->register_module("proj", std::make_shared<LinearImpl>(d, d, true));
  mlp = register_module("mlp", std::make_shared<ModuleGroup>());
  gate_proj = mlp->register_module("gate_proj", std::make_shared<LinearImpl>(d, f, true));
  up_proj = mlp->register_module("up_proj", std::make_shared<LinearImpl>(d, f, true));
  down_proj = mlp->register_module("down_proj", std::make_shared<LinearImpl>(f, d, true));
}

at::Tensor Qwen25VisionBlock::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
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
                                            "Qwen2.5-VL vision block");
  auto h = x + proj->forward(out.reshape({n, d}));
  auto y = norm2->forward(h);
  auto gate = gate_proj->forward(y);
  gate = silu ? at::silu(gate) : at::gelu(gate);
  return h + down_proj->forward(gate * up_proj->forward(y));
}

Qwen25VisionEncoder::Qwen25VisionEncoder(const Qwen25VisionConfig& c) : config(c) {
  auto pe = register_module("patch_embed", std::make_shared<ModuleGroup>());
  auto pr = pe->register_module("proj", std::make_shared<ModuleGroup>());
  patch_embed = pr->register_parameter(
      "weight", at::empty({c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  auto list = register_module("blocks", std::make_shared<ModuleGroup>());
  for (int64_t i = 0; i < c.depth; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<Qwen25VisionBlock>(c)));
  merger = register_module("merger", std::make_shared<Qwen25VisionMerger>(c));
}

Qwen25VisionMerger::Qwen25VisionMerger(const Qwen25VisionConfig& c) : unit(c.merge_unit()) {
  ln_q = register_module("ln_q", std::make_shared<RMSNormImpl>(c.hidden_size, 1e-6));
  auto mlp = register_module("mlp", std::make_shared<ModuleGroup>());
  const int64_t wide = c.hidden_size * unit;
  fc1 = mlp->register_module("0", std::make_shared<LinearImpl>(wide, wide, true));
  fc2 = mlp->register_module("2", std::make_shared<LinearImpl>(wide, c.out_hidden_size, true));
}

at::Tensor Qwen25VisionMerger::forward(const at::Tensor& h) {
  auto merged = ln_q->forward(h).reshape({h.size(0) / unit, unit * h.size(1)});
  return fc2->forward(at::gelu(fc1->forward(merged)));
}

at::Tensor Qwen25VisionEncoder::features(const at::Tensor& pixel_values, const at::Tensor& grid_thw) {
  const auto& c = config;
  if (pixel_values.dim() != 2 || pixel_values.size(1) != c.patch_dim())
    throw std::invalid_argument(
        "Qwen2.5-VL vision: pixel_values must be [N, " + std::to_string(c.patch_dim()) +
        "] (C * temporal_patch_size * patch_size^2), got " + std::to_string(pixel_values.dim()) + "-D with " +
        std::to_string(pixel_values.size(-1)) + " columns");
  const auto layout = Qwen25VisionLayout::of(grid_thw, c);
  const int64_t n = pixel_values.size(0), unit = c.merge_unit(), d = c.hidden_size;
  if (layout.positions.size(0) != n)
    throw std::invalid_argument("Qwen2.5-VL vision: grid_thw covers " +
                                std::to_string(layout.positions.size(0)) + " patches but pixel_values has " +
                                std::to_string(n));
  const auto dev = pixel_values.device();
  auto window_index = layout.window_index.to(dev), unwindow = layout.unwindow.to(dev);
  auto to_windows =
      [&](const at::Tensor& t) {  // [N, X] processor order -> windowed order, whole merge blocks
        return t.reshape({n / unit, unit, -1}).index_select(0, window_index).reshape({n, -1});
      };
  // The published Conv3d (stride = kernel) over each patch viewed as [C, T, P, P]: one output per patch. A
  // matmul with the flattened kernel is the same sum, but not in the same order (1 ulp apart on the CPU); the
  // convolution keeps transformers' rounding.
  auto h = at::conv3d(pixel_values.to(patch_embed.scalar_type())
                          .view({n, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}),
                      patch_embed, {}, {c.temporal_patch_size, c.patch_size, c.patch_size})
               .view({n, d});
  h = to_windows(h);
  // 2-D rotary: the first half of the frequencies turn with the row, the second half with the column.
  auto inv = RotaryEmbedding(c.head_dim() / 2, c.rope_theta).inv_freq(dev);  // [Dh/4]
  auto ang = layout.positions.to(dev).to(at::kFloat).unsqueeze(-1) * inv;    // [N, 2, Dh/4]
  ang = to_windows(ang.reshape({n, -1}));                                    // [N, Dh/2]: rows, then columns
  auto cos = at::cat({ang.cos(), ang.cos()}, -1), sin = at::cat({ang.sin(), ang.sin()}, -1);
  for (int64_t i = 0; i < c.depth; ++i) {
    const bool full = std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), i) !=
                      c.fullatt_block_indexes.end();
    const auto& segments = full ? layout.frame_lengths : layout.window_lengths;
    auto block = blocks[i];
    auto run = [block, cos, sin, segments](const at::Tensor& x) {
      return block->forward(x, cos, sin, segments);
    };
    h = run_unit(*block, [&] {
      return checkpoint_units_
                 ? checkpointed_unit(run, h, block->parameters(), "Qwen2.5-VL vision block " + std::to_string(i))
                 : run(h);
    });
  }
  auto merged = run_unit(*merger, [&] { return merger->forward(h); });
  return merged.index_select(0, unwindow);
}

bool Qwen25VisionEncoder::init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const {
  (void)gen;
  if (name != "merger.ln_q.weight") return false;
  t.fill_(1.0);
  return true;
}

at::Tensor Qwen25VisionEncoder::features(const at::Tensor& pixel_values) {
  (void)pixel_values;
  throw std::invalid_argument(
      "Qwen2.5-VL vision: features need each image's grid_thw (ModelInputs::image_grid_thw)");
}

void Qwen25VisionEncoder::load(const SafetensorsFile& file, const std::string& prefix) {
  at::NoGradGuard ng;
  for (auto& p : named_parameters()) {
    const auto name = prefix + p.key();
    if (!file.has(name)) throw std::runtime_error(file.path() + ": tensor " + name + " is missing");
    copy_into(p.value(), file.tensor(name), name, file.path());
  }
}

}  // namespace gmod

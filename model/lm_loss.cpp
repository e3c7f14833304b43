#include "model/lm_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gmod {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Fused LM head + cross-entropy over selected rows. forward(rows [N, D], weight [V, D], targets [N] int64,
// chunk) -> scalar fp32 sum of -log_softmax(rows @ weight^T)[i, targets[i]].
class HeadCrossEntropy : public torch::autograd::Function<HeadCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t chunk) {
    const int64_t N = rows.size(0);
    at::Tensor lse = at::empty({N}, rows.options().dtype(at::kFloat));  // [N] log-sum-exp per row
    at::Tensor sum = at::zeros({}, rows.options().dtype(at::kFloat));
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
      const int64_t n = std::min(chunk, N - c0);
      at::Tensor lf = at::linear(rows.narrow(0, c0, n), weight).to(at::kFloat);  // [n, V]
      // The kernels of the full-logits path (cross_entropy_loss = log_softmax + nll_loss), on this chunk's
      // rows.
      at::Tensor ls = at::log_softmax(lf, 1);  // [n, V]
      at::Tensor t = targets.narrow(0, c0, n);
      sum.add_(at::nll_loss(ls, t, {}, at::Reduction::Sum, -100));
      // log-sum-exp = logit - log_softmax in any column (the target's: |log p| is small there, so is the
      // rounding), so backward's softmax is one in-place exp.
      const at::Tensor tc = t.unsqueeze(1);
      lse.narrow(0, c0, n).copy_((lf.gather(1, tc) - ls.gather(1, tc)).squeeze(1));
    }
    ctx->save_for_backward({rows, weight, targets, lse});
    ctx->saved_data["chunk"] = chunk;
    return sum;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t N = rows.size(0);
    const bool want_rows = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const at::Tensor go = grad_out[0].to(at::kFloat);  // [] d loss / d sum
    at::Tensor g_rows = want_rows ? at::empty_like(rows) : at::Tensor();
    // Several chunks: the weight gradient is summed in fp32 (low-precision weights: each chunk's product
    // rounded once to their dtype), then cast to the weight's dtype.
    const bool one_chunk = N <= chunk;
    at::Tensor g_w;
    if (want_w && !one_chunk) g_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
      const int64_t n = std::min(chunk, N - c0);
      at::Tensor x = rows.narrow(0, c0, n);
      // d/dlogits = softmax - onehot(target), times the incoming gradient: [n, V] fp32, in place.
      at::Tensor p = at::linear(x, weight).to(at::kFloat);
      p.sub_(lse.narrow(0, c0, n).unsqueeze(1)).exp_();
      at::Tensor t = targets.narrow(0, c0, n).unsqueeze(1);
      p.scatter_add_(1, t, at::full({n, 1}, -1.0, p.options()));
      p.mul_(go);
      // The full-logits path hands the fp32 gradient to the head GEMM in the compute dtype (.to's backward).
      at::Tensor g = p.scalar_type() == rows.scalar_type() ? p : p.to(rows.scalar_type());  // [n, V]
      p = at::Tensor();
      if (want_rows) {
        at::Tensor dst = g_rows.narrow(0, c0, n);  // [n, D]
        at::mm_out(dst, g, weight);
      }
      if (want_w) {
        if (one_chunk)
          g_w = at::mm(g.t(), x);  // [V, D]
        else if (g.scalar_type() == at::kFloat)
          g_w.addmm_(g.t(), x);
        else
          g_w.add_(at::mm(g.t(), x));
      }
    }
    if (want_w && !g_w.defined()) g_w = at::zeros_like(weight);  // no labelled position
    if (want_w && g_w.scalar_type() != weight.scalar_type()) g_w = g_w.to(weight.scalar_type());
    return {g_rows, g_w, at::Tensor(), at::Tensor()};
  }
};

std::string shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

}  // namespace

int64_t lm_loss_chunk_rows(int64_t vocab_size) {
  constexpr int64_t kBudget = int64_t(256) << 20;  // bytes of one chunk's fp32 logits
  return std::max<int64_t>(1, kBudget / (4 * std::max<int64_t>(1, vocab_size)));
}

std::pair<at::Tensor, int64_t> label_only_lm_loss_sum(const at::Tensor& hidden, const at::Tensor& head_weight,
                                                      const at::Tensor& labels, int64_t chunk_rows) {
  if (hidden.dim() != 3 || labels.dim() != 2 || labels.size(0) != hidden.size(0) ||
      labels.size(1) != hidden.size(1))
    throw std::invalid_argument("lm_loss: hidden states " + shape(hidden) + " and labels " + shape(labels) +
                                " must be [B, L, D] and [B, L]");
  if (head_weight.dim() != 2 || head_weight.size(1) != hidden.size(2))
    throw std::invalid_argument("lm_loss: head weight " + shape(head_weight) + " must be [V, " +
                                std::to_string(hidden.size(2)) + "] (hidden size)");
  const int64_t B = hidden.size(0), L = hidden.size(1), D = hidden.size(2);
  if (chunk_rows <= 0) chunk_rows = lm_loss_chunk_rows(head_weight.size(0));
  // Position t of row b predicts labels[b, t + 1]: flat row b * L + t of the [B * L, D] hidden states.
  at::Tensor next = labels.narrow(1, 1, L - 1);             // [B, L-1]
  at::Tensor bt = at::nonzero(next != -100);                // [N, 2] (b, t), row-major order
  at::Tensor flat = bt.select(1, 0) * L + bt.select(1, 1);  // [N]
  at::Tensor targets = next.reshape({-1}).index_select(0, bt.select(1, 0) * (L - 1) + bt.select(1, 1));
  at::Tensor rows = hidden.reshape({B * L, D}).index_select(0, flat);  // [N, D]
  at::Tensor sum = HeadCrossEntropy::apply(rows, head_weight, targets.to(at::kLong), chunk_rows);
  return {sum, flat.size(0)};
}

ModelOutput forward_label_loss(MultimodalLM& model, const ModelInputs& in, ForwardState& st,
                               int64_t chunk_rows) {
  if (!in.labels.defined()) throw std::invalid_argument("lm_loss: forward_label_loss needs labels");
  at::Tensor h = model.hidden_states(in, st);  // [B, L, D]: the decoder part of MultimodalLM::forward
  ModelOutput out;
  auto [sum, count] = label_only_lm_loss_sum(h, model.lm_head_weight(), in.labels, chunk_rows);
  out.lm_loss_sum = sum;
  out.supervised_tokens = count;
  out.lm_loss = sum / static_cast<double>(std::max<int64_t>(count, 1));
  return out;
}

}  // namespace gmod

#include "parallel/sharded_adamw.h"

#include "parallel/adamw_cpu.h"
#include "parallel/pinned_host.h"

#include <nlohmann/json.hpp>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace gmod {
namespace {

// Elements updated per chunk: bounds the temporary `denom` to 256 MiB of fp32.
constexpr int64_t kChunk = int64_t(64) << 20;

void check_fp32(const at::Tensor& t, int64_t n, const char* what) {
  if (!t.defined() || t.scalar_type() != at::kFloat || t.dim() != 1 || t.numel() != n || !t.is_contiguous())
    throw std::runtime_error(std::string("parallel/sharded_adamw: ") + what + " must be a contiguous fp32 [" +
                             std::to_string(n) + "] tensor" +
                             (t.defined() ? ", got " + std::string(c10::toString(t.scalar_type())) + " with " +
                                                std::to_string(t.numel()) + " elements"
                                          : ", got undefined"));
}

}  // namespace

nlohmann::json AdamWShardState::meta() const {
  return {{"layout", layout.to_json()}, {"stage", stage}, {"rank", rank},
          {"begin", begin},             {"end", end},     {"step", step}};
}

AdamWShardState AdamWShardState::from_meta(const nlohmann::json& j) {
  AdamWShardState s;
  try {
    s.layout = FlatParamLayout::from_json(j.at("layout"));
    s.stage = j.at("stage").get<int>();
    s.rank = j.at("rank").get<int>();
    s.begin = j.at("begin").get<int64_t>();
    s.end = j.at("end").get<int64_t>();
    s.step = j.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("parallel/sharded_adamw: bad optimizer state metadata: ") + e.what());
  }
  return s;
}

ShardedAdamW::ShardedAdamW(int64_t begin, int64_t end, const at::Tensor& master0, AdamWHyper hyper)
    : begin_(begin), end_(end), hyper_(hyper) {
  if (begin < 0 || end < begin) throw std::runtime_error("parallel/sharded_adamw: bad range");
  if (master0.numel() != end - begin)
    throw std::runtime_error("parallel/sharded_adamw: initial master has " + std::to_string(master0.numel()) +
                             " elements, range has " + std::to_string(end - begin));
  if (hyper.offload) {
    // Host memory; pinned when the parameters are on a CUDA device, so the gradient and parameter copies are DMA.
    pinned_ = master0.is_cuda();
    // Exactly sized (parallel/pinned_host.h: not the caching host allocator's power-of-two blocks).
    master_ = host_empty(end - begin, at::kFloat, pinned_, "the offloaded master weights");
    master_.copy_(master0.reshape({-1}));
    exp_avg_ = host_empty(end - begin, at::kFloat, pinned_, "the offloaded exp_avg").zero_();
    exp_avg_sq_ = host_empty(end - begin, at::kFloat, pinned_, "the offloaded exp_avg_sq").zero_();
  } else {
    master_ = master0.reshape({-1}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
    exp_avg_ = at::zeros_like(master_);
    exp_avg_sq_ = at::zeros_like(master_);
  }
  if (end > begin) decay_ = {{begin, end}};
  group_wd_ = {hyper_.weight_decay};
  build_segments();
}

void ShardedAdamW::build_segments() {
  // Boundaries of the decay ranges and the group ranges, then one segment per piece between two boundaries.
  std::vector<int64_t> cuts{begin_, end_};
  for (const auto& [b, e] : decay_) cuts.push_back(b), cuts.push_back(e);
  for (const GroupRange& g : groups_) cuts.push_back(g.begin), cuts.push_back(g.end);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  segments_.clear();
  size_t di = 0, gi = 0;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const int64_t b = cuts[k], e = cuts[k + 1];
    while (di < decay_.size() && decay_[di].second <= b) ++di;
    while (gi < groups_.size() && groups_[gi].end <= b) ++gi;
    Segment s{b, e, 0, di < decay_.size() && decay_[di].first <= b};
    if (gi < groups_.size() && groups_[gi].begin <= b) s.group = groups_[gi].group;
    if (!segments_.empty() && segments_.back().group == s.group && segments_.back().decay == s.decay)
      segments_.back().end = e;  // fewer kernels per step
    else
      segments_.push_back(s);
  }
}

void ShardedAdamW::set_groups(const std::vector<GroupRange>& ranges, std::vector<double> weight_decay) {
  if (weight_decay.empty()) throw std::runtime_error("parallel/sharded_adamw: set_groups without group 0");
  std::vector<GroupRange> out;  // assigned only when every range is valid
  int64_t last = std::numeric_limits<int64_t>::min();
  for (GroupRange g : ranges) {
    if (g.end < g.begin || g.begin < last)
      throw std::runtime_error("parallel/sharded_adamw: group range [" + std::to_string(g.begin) + ", " +
                               std::to_string(g.end) +
                               ") is reversed or starts before the previous one ends (sorted, disjoint ranges)");
    if (g.group < 0 || g.group >= int(weight_decay.size()))
      throw std::runtime_error("parallel/sharded_adamw: group range [" + std::to_string(g.begin) + ", " +
                               std::to_string(g.end) + ") names group " + std::to_string(g.group) + " of " +
                               std::to_string(weight_decay.size()));
    last = g.end;
    g.begin = std::max(g.begin, begin_);
    g.end = std::min(g.end, end_);
    if (g.begin >= g.end || g.group == 0) continue;
    if (!out.empty() && out.back().end == g.begin && out.back().group == g.group)
      out.back().end = g.end;
    else
      out.push_back(g);
  }
  groups_ = std::move(out);
  group_wd_ = std::move(weight_decay);
  build_segments();
}

void ShardedAdamW::set_decay_ranges(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;  // assigned only when every range is valid
  int64_t last = std::numeric_limits<int64_t>::min();
  for (auto [b, e] : ranges) {
    if (e < b || b < last)
      throw std::runtime_error("parallel/sharded_adamw: decay range [" + std::to_string(b) + ", " + std::to_string(e) +
                               ") is reversed or starts before the previous one ends (sorted, disjoint ranges)");
    last = e;
    b = std::max(b, begin_);
    e = std::min(e, end_);
    if (b >= e) continue;
    if (!out.empty() && out.back().second == b)
      out.back().second = e;  // adjacent parameters merge: fewer kernels per step
    else
      out.emplace_back(b, e);
  }
  decay_ = std::move(out);
  build_segments();
}

void ShardedAdamW::step(const at::Tensor& grad, const std::vector<double>& lrs) {
  check_fp32(grad, end_ - begin_, "grad");
  if (lrs.size() != group_wd_.size())
    throw std::runtime_error("parallel/sharded_adamw: step with " + std::to_string(lrs.size()) +
                             " learning rates for " + std::to_string(group_wd_.size()) + " parameter groups");
  step_ += 1;
  const double bias_correction1 = 1.0 - std::pow(hyper_.beta1, double(step_));
  const double bias_correction2 = 1.0 - std::pow(hyper_.beta2, double(step_));
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  if (!hyper_.offload) {
    step_aten(grad, lrs, bias_correction1, bias_correction2_sqrt);
    return;
  }
  c10::NoGradGuard no_grad;
  const at::Tensor* g = &grad;
  if (!grad.device().is_cpu()) {
    if (!grad_host_.defined())
      grad_host_ = host_empty(end_ - begin_, at::kFloat, pinned_, "the offloaded gradient copy");
    grad_host_.copy_(grad);  // synchronous: the update below reads it
    g = &grad_host_;
  }
  // One set of coefficients per group; segments in the state's own coordinates.
  std::vector<AdamWCpuCoeffs> coeffs;
  for (size_t k = 0; k < lrs.size(); ++k)
    coeffs.push_back(adamw_cpu_coeffs(lrs[k], hyper_.beta1, hyper_.beta2, hyper_.eps, group_wd_[k],
                                      bias_correction1, bias_correction2_sqrt));
  std::vector<AdamWCpuRun> runs;
  for (const Segment& s : segments_)
    runs.push_back({s.begin - begin_, s.end - begin_, s.group, s.decay && group_wd_[size_t(s.group)] != 0.0});
  adamw_cpu_update(master_, exp_avg_, exp_avg_sq_, *g, runs, coeffs);
}

void ShardedAdamW::step_aten(const at::Tensor& grad, const std::vector<double>& lrs, double bias_correction1,
                             double bias_correction2_sqrt) {
  const double b1 = hyper_.beta1, b2 = hyper_.beta2;
  const int64_t n = end_ - begin_;
  // Same operation sequence as torch.optim.AdamW's single-tensor path, each segment with its group's lr and
  // weight decay (torch runs it per parameter tensor; every operation is elementwise, so where a tensor is cut
  // does not change a bit).
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    const int64_t c0 = begin_ + off, c1 = c0 + len;
    at::Tensor p = master_.narrow(0, off, len), g = grad.narrow(0, off, len);
    at::Tensor m = exp_avg_.narrow(0, off, len), v = exp_avg_sq_.narrow(0, off, len);
    for (const Segment& s : segments_) {
      const double lr = lrs[size_t(s.group)], wd = group_wd_[size_t(s.group)];
      const int64_t lo = std::max(s.begin, c0), hi = std::min(s.end, c1);
      if (s.decay && wd != 0.0 && lo < hi) p.narrow(0, lo - c0, hi - lo).mul_(1.0 - lr * wd);
    }
    m.lerp_(g, 1.0 - b1);
    v.mul_(b2).addcmul_(g, g, 1.0 - b2);
    at::Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(hyper_.eps);
    // Runs of one group get one addcdiv_ (the decay flag does not matter here).
    int64_t lo = c0;
    while (lo < c1) {
      auto it = std::upper_bound(segments_.begin(), segments_.end(), lo,
                                 [](int64_t x, const Segment& s) { return x < s.end; });
      const int group = it == segments_.end() ? 0 : it->group;
      int64_t hi = c1;
      for (; it != segments_.end() && it->begin < c1; ++it)
        if (it->group != group) {
          hi = std::max(lo, it->begin);
          break;
        }
      const double step_size = lrs[size_t(group)] / bias_correction1;
      p.narrow(0, lo - c0, hi - lo).addcdiv_(m.narrow(0, lo - c0, hi - lo), denom.narrow(0, lo - c0, hi - lo),
                                             -step_size);
      lo = hi;
    }
  }
}

int64_t ShardedAdamW::state_bytes() const {
  return master_.nbytes() + exp_avg_.nbytes() + exp_avg_sq_.nbytes();
}

int64_t ShardedAdamW::host_bytes() const {
  if (!hyper_.offload) return 0;
  return state_bytes() + (grad_host_.defined() ? grad_host_.nbytes() : 0) +
         (out_host_.defined() ? out_host_.nbytes() : 0);
}

void ShardedAdamW::copy_master_to(at::Tensor dst) const {
  c10::NoGradGuard no_grad;
  if (dst.numel() != master_.numel())
    throw std::runtime_error("parallel/sharded_adamw: copy_master_to a tensor of " + std::to_string(dst.numel()) +
                             " elements, range has " + std::to_string(master_.numel()));
  at::Tensor d = dst.view({-1});  // throws unless dst can be written through a flat view
  if (hyper_.offload && !dst.device().is_cpu() && dst.scalar_type() != at::kFloat) {
    // Round on the host (the same round-to-nearest-even as on the device), move half the bytes for bf16.
    if (!out_host_.defined() || out_host_.scalar_type() != dst.scalar_type())
      out_host_ = host_empty(master_.numel(), dst.scalar_type(), pinned_, "the offloaded weight write-back");
    out_host_.copy_(master_);
    d.copy_(out_host_);
  } else {
    d.copy_(master_);
  }
}

void ShardedAdamW::reset_master(const at::Tensor& values) {
  if (values.numel() != master_.numel())
    throw std::runtime_error("parallel/sharded_adamw: reset_master with " + std::to_string(values.numel()) +
                             " elements, range has " + std::to_string(master_.numel()));
  master_.copy_(values.reshape({-1}));
}

void ShardedAdamW::load(const AdamWShardState& s) {
  if (s.begin != begin_ || s.end != end_)
    throw std::runtime_error("parallel/sharded_adamw: state covers [" + std::to_string(s.begin) + ", " +
                             std::to_string(s.end) + "), this rank owns [" + std::to_string(begin_) + ", " +
                             std::to_string(end_) + "); reshard it with reshard_state first");
  const int64_t n = end_ - begin_;
  for (const at::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq})
    if (!t->defined() || t->numel() != n)
      throw std::runtime_error("parallel/sharded_adamw: state tensor has wrong size (expected " + std::to_string(n) +
                               " elements)");
  c10::NoGradGuard no_grad;
  // A state read in place (CheckpointReader::read_rank_state into these buffers) is already here.
  for (auto [dst, src] : {std::pair<at::Tensor*, const at::Tensor*>{&master_, &s.master}, {&exp_avg_, &s.exp_avg},
                          {&exp_avg_sq_, &s.exp_avg_sq}})
    if (src->data_ptr() != dst->data_ptr()) dst->copy_(src->reshape({-1}));
  step_ = s.step;
}

namespace {

// Elements [b, e) of the unpadded flat vector for one state tensor, from states covering disjoint ranges.
at::Tensor gather_range(const std::vector<const AdamWShardState*>& states, at::Tensor AdamWShardState::*field,
                        int64_t b, int64_t e) {
  at::Tensor out = at::empty({e - b}, at::TensorOptions().dtype(at::kFloat));
  int64_t covered = 0;
  for (const AdamWShardState* s : states) {
    const int64_t lo = std::max(b, s->begin), hi = std::min(e, s->end);
    if (lo >= hi) continue;
    out.narrow(0, lo - b, hi - lo).copy_((s->*field).reshape({-1}).narrow(0, lo - s->begin, hi - lo));
    covered += hi - lo;
  }
  if (covered != e - b)
    throw std::runtime_error("parallel/sharded_adamw: saved states cover " + std::to_string(covered) + " of the " +
                             std::to_string(e - b) + " elements needed; pass the states of every saved rank");
  return out;
}

}  // namespace

AdamWShardState reshard_state(const std::vector<AdamWShardState>& saved, int new_world, int new_rank, int new_stage) {
  if (saved.empty()) throw std::runtime_error("parallel/sharded_adamw: reshard_state without saved states");
  const AdamWShardState& first = saved.front();
  std::vector<const AdamWShardState*> states;
  for (const auto& s : saved) {
    if (!s.layout.same_params(first.layout))
      throw std::runtime_error("parallel/sharded_adamw: saved states disagree on the parameter layout");
    if (s.step != first.step)
      throw std::runtime_error("parallel/sharded_adamw: saved states disagree on the step count (" +
                               std::to_string(s.step) + " vs " + std::to_string(first.step) + ")");
    states.push_back(&s);
  }
  if (first.stage == 0) states.resize(1);  // every stage-0 rank holds the full identical state
  AdamWShardState out;
  out.layout = first.layout.with_world_size(new_world);
  out.stage = new_stage;
  out.rank = new_rank;
  out.step = first.step;
  if (new_stage == 0) {
    out.begin = 0;
    out.end = out.layout.total();
  } else {
    std::tie(out.begin, out.end) = out.layout.shard_range(new_rank);
  }
  auto [vb, ve] = std::pair<int64_t, int64_t>{std::min(out.begin, out.layout.total()),
                                              std::min(out.end, out.layout.total())};
  for (auto field : {&AdamWShardState::master, &AdamWShardState::exp_avg, &AdamWShardState::exp_avg_sq}) {
    at::Tensor t = at::zeros({out.end - out.begin}, at::TensorOptions().dtype(at::kFloat));
    if (vb < ve) t.narrow(0, vb - out.begin, ve - vb).copy_(gather_range(states, field, vb, ve));
    out.*field = t;
  }
  return out;
}

std::vector<AdamWShardState> reshard_states(const std::vector<AdamWShardState>& saved, int new_world, int new_stage) {
  std::vector<AdamWShardState> out;
  const int n = new_stage == 0 ? 1 : new_world;
  for (int r = 0; r < n; ++r) out.push_back(reshard_state(saved, new_world, r, new_stage));
  return out;
}

}  // namespace gmod

#include "data/arank_samples.h"

#include <algorithm>
#include <stdexcept>

namespace gmod {

std::string ARankSamplingStats::summary() const {
  return std::to_string(taken) + " samples (" + std::to_string(text_only) + " text-only, " + std::to_string(bad) +
         " bad, " + std::to_string(no_prompt) + " without a usable prompt skipped)";
}

bool cut_to_first_prompt(TokenizedSample& s) {
  const auto first = std::find_if(s.labels.begin(), s.labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
  if (first == s.labels.end() || first == s.labels.begin()) return false;
  const size_t cut = size_t(first - s.labels.begin());
  for (size_t i = cut; i < s.roles.size(); ++i)
    if (s.roles[i] == TokenRole::kImage) return false;
  s.ids.resize(cut);
  s.labels.assign(cut, kIgnoreIndex);
  s.roles.resize(cut);
  return true;
}

std::vector<Batch> arank_batches(const Dataset& ds, const std::vector<size_t>& order, const ARankSampling& opt,
                                 ARankSamplingStats& stats) {
  std::vector<Batch> out;
  std::vector<PreparedSample> pending;
  const int crop = ds.config().image.crop;
  auto flush = [&] {
    if (pending.empty()) return;
    out.push_back(collate(pending, ds.encoder().pad_id(), crop));
    pending.clear();
  };
  for (size_t k = 0; k < order.size() && stats.taken < opt.samples; ++k) {
    PreparedSample s;
    BadRecord br;
    if (!ds.try_prepare(order[k], s, br)) {
      if (stats.bad++ == 0) stats.first_bad = br.message;
      continue;
    }
    if (opt.images_only && s.sample.images.empty() && s.sample.videos.empty()) {  // a video counts as visual
      ++stats.text_only;
      continue;
    }
    if (opt.prompt_only && !cut_to_first_prompt(s.sample)) {
      ++stats.no_prompt;
      continue;
    }
    pending.push_back(std::move(s));
    ++stats.taken;
    if (int(pending.size()) == opt.batch) flush();
  }
  flush();
  if (stats.taken == 0)
    throw std::runtime_error(ds.config().data_path + ": no sample usable for ARank among " +
                             std::to_string(order.size()) + " records (" + std::to_string(stats.text_only) +
                             " text-only, " + std::to_string(stats.bad) + " bad, " + std::to_string(stats.no_prompt) +
                             " without a prompt before the first answer" +
                             (opt.images_only ? "; ARank needs image samples" : "") + ")" +
                             (stats.first_bad.empty() ? "" : "; first bad record: " + stats.first_bad));
  return out;
}

SeqLenMean mean_seqlen(const std::vector<Batch>& batches) {
  SeqLenMean r;
  int64_t tokens = 0;
  for (const Batch& b : batches) {
    if (b.empty()) continue;
    tokens += b.attention_mask.defined() ? b.attention_mask.to(at::kLong).sum().item<int64_t>()
                                         : b.input_ids.numel();
    r.samples += b.size();
  }
  if (r.samples == 0) throw std::invalid_argument("mean_seqlen: no sample in the batches");
  r.mean = static_cast<double>(tokens) / static_cast<double>(r.samples);
  return r;
}

}  // namespace gmod

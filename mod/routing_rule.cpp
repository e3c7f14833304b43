#include "mod/routing_rule.h"

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace gmod {

at::Tensor threshold_factor(const MoDConfig& c, int layer_idx, const at::Tensor& seqlen) {
  auto ones = at::ones({seqlen.size(0)}, seqlen.options().dtype(at::kDouble));
  switch (c.adaptive_threshold) {
    case AdaptiveThreshold::kNone:
      return ones;
    case AdaptiveThreshold::kSeqLen:
      if (!(c.avg_seqlen > 0.0))
        throw std::invalid_argument("adaptive_threshold seqlen: avg_seqlen must be > 0");
      return 1.0 + at::log(seqlen.to(at::kDouble) / c.avg_seqlen);
    case AdaptiveThreshold::kARank: {
      if (c.layer_arank.size() != c.mod_layers.size() || c.layer_arank.empty())
        throw std::invalid_argument("adaptive_threshold arank: layer_arank needs one value per MoD layer");
      size_t i = 0;
      while (i < c.mod_layers.size() && c.mod_layers[i] != layer_idx) ++i;
      if (i == c.mod_layers.size())
        throw std::invalid_argument("adaptive_threshold arank: layer " + std::to_string(layer_idx) +
                                    " is not one of the MoD layers");
      const double mean = std::accumulate(c.layer_arank.begin(), c.layer_arank.end(), 0.0) /
                          static_cast<double>(c.layer_arank.size());
      return ones * (1.0 + std::log(c.layer_arank[i] / mean));
    }
  }
  return ones;
}

at::Tensor routing_thresholds(const MoDConfig& c, int layer_idx, double base, const at::Tensor& seqlen) {
  return threshold_factor(c, layer_idx, seqlen) * base;
}

at::Tensor adaptive_decode_thresholds(const MoDConfig& c, int layer_idx, const at::Tensor& key_valid,
                                      int64_t B, int64_t length) {
  const auto seqlen = key_valid.defined() ? key_valid.to(at::kBool).sum(1) : at::full({B}, length, at::kLong);
  return routing_thresholds(c, layer_idx, c.decode_threshold, seqlen);
}

}  // namespace gmod

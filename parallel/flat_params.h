// FlatParamLayout: where each trainable parameter lives in one flat vector, and how that vector is split into
// equal per-rank shards for ZeRO. Parameters keep the order given (typically named_parameters order); the unpadded
// flat vector [0, P) is topology independent, the padded length is ceil(P / world) * world (padding only at the
// tail) and rank r owns [r*S, (r+1)*S) with S = padded / world. Serialisable to JSON so a checkpoint can record it,
// and read_range/reshard_flat rebuild any range of the unpadded vector from shards saved at another world size.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gmod {

struct FlatParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // start in the flat vector
};

// The part of one parameter that falls inside a flat range.
struct FlatPiece {
  size_t index = 0;        // entry index
  int64_t param_begin = 0; // element offset inside the (flattened) parameter
  int64_t flat_begin = 0;  // = entry.offset + param_begin
  int64_t length = 0;
};

class FlatParamLayout {
 public:
  FlatParamLayout() = default;
  // names[i] has shape shapes[i]; offsets are assigned in this order. Throws on a duplicate name or world < 1.
  FlatParamLayout(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes, int world);
  static FlatParamLayout from_params(const std::vector<std::pair<std::string, at::Tensor>>& params, int world);

  int world_size() const { return world_; }
  int64_t total() const { return total_; }             // P
  int64_t padded_total() const { return padded_; }     // ceil(P / world) * world
  int64_t shard_size() const { return padded_ / world_; }  // S
  int64_t padding() const { return padded_ - total_; }
  // [r*S, (r+1)*S) in padded coordinates.
  std::pair<int64_t, int64_t> shard_range(int rank) const;
  // shard_range clipped to the real parameters [0, P) (may be empty for trailing ranks of tiny layouts).
  std::pair<int64_t, int64_t> valid_range(int rank) const;

  const std::vector<FlatParamEntry>& entries() const { return entries_; }
  const FlatParamEntry& entry(const std::string& name) const;  // throws if unknown
  // The parameters overlapping [begin, end) (clipped to [0, P)), in flat order.
  std::vector<FlatPiece> pieces(int64_t begin, int64_t end) const;

  // Same parameters (names, shapes, order), any world size.
  bool same_params(const FlatParamLayout& other) const;
  FlatParamLayout with_world_size(int world) const;

  nlohmann::json to_json() const;
  static FlatParamLayout from_json(const nlohmann::json& j);

 private:
  void finish(int world);

  std::vector<FlatParamEntry> entries_;
  int world_ = 1;
  int64_t total_ = 0, padded_ = 0;
};

// Elements [begin, end) of the unpadded flat vector (0 <= begin <= end <= P), assembled from `shards` saved with
// `layout` (shards[r] covers layout.shard_range(r), either with its padding or trimmed to valid_range(r)).
at::Tensor read_range(const FlatParamLayout& layout, const std::vector<at::Tensor>& shards, int64_t begin,
                      int64_t end);
// Shards for `new_world`: each [S'] with zero padding, exactly the same values in [0, P).
std::vector<at::Tensor> reshard_flat(const FlatParamLayout& layout, const std::vector<at::Tensor>& shards,
                                     int new_world);

}  // namespace gmod

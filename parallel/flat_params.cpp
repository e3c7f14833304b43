#include "parallel/flat_params.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace gmod {

FlatParamLayout::FlatParamLayout(const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& shapes, int world) {
  if (names.size() != shapes.size())
    throw std::runtime_error("parallel/flat_params: " + std::to_string(names.size()) + " names but " +
                             std::to_string(shapes.size()) + " shapes");
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!seen.insert(names[i]).second)
      throw std::runtime_error("parallel/flat_params: duplicate parameter name '" + names[i] + "'");
    FlatParamEntry e;
    e.name = names[i];
    e.shape = shapes[i];
    e.numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) throw std::runtime_error("parallel/flat_params: negative dimension in '" + names[i] + "'");
      e.numel *= d;
    }
    entries_.push_back(std::move(e));
  }
  finish(world);
}

FlatParamLayout FlatParamLayout::from_params(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                             int world) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& [name, t] : params) {
    names.push_back(name);
    shapes.push_back(t.sizes().vec());
  }
  return FlatParamLayout(names, shapes, world);
}

void FlatParamLayout::finish(int world) {
  if (world < 1) throw std::runtime_error("parallel/flat_params: world size must be >= 1, got " + std::to_string(world));
  world_ = world;
  total_ = 0;
  for (auto& e : entries_) {
    e.offset = total_;
    total_ += e.numel;
  }
  padded_ = (total_ + world - 1) / world * world;
}

std::pair<int64_t, int64_t> FlatParamLayout::shard_range(int rank) const {
  if (rank < 0 || rank >= world_)
    throw std::runtime_error("parallel/flat_params: rank " + std::to_string(rank) + " outside world " +
                             std::to_string(world_));
  const int64_t s = shard_size();
  return {rank * s, (rank + 1) * s};
}

std::pair<int64_t, int64_t> FlatParamLayout::valid_range(int rank) const {
  auto [b, e] = shard_range(rank);
  b = std::min(b, total_);
  e = std::min(e, total_);
  return {b, e};
}

const FlatParamEntry& FlatParamLayout::entry(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  throw std::runtime_error("parallel/flat_params: no parameter named '" + name + "' in the layout");
}

std::vector<FlatPiece> FlatParamLayout::pieces(int64_t begin, int64_t end) const {
  std::vector<FlatPiece> out;
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, total_);
  if (begin >= end) return out;
  // First entry whose end is past `begin`.
  auto it = std::upper_bound(entries_.begin(), entries_.end(), begin,
                             [](int64_t v, const FlatParamEntry& e) { return v < e.offset + e.numel; });
  for (; it != entries_.end() && it->offset < end; ++it) {
    if (it->numel == 0) continue;
    const int64_t b = std::max(begin, it->offset), e = std::min(end, it->offset + it->numel);
    out.push_back({static_cast<size_t>(it - entries_.begin()), b - it->offset, b, e - b});
  }
  return out;
}

bool FlatParamLayout::same_params(const FlatParamLayout& o) const {
  if (entries_.size() != o.entries_.size()) return false;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].name != o.entries_[i].name || entries_[i].shape != o.entries_[i].shape) return false;
  return true;
}

FlatParamLayout FlatParamLayout::with_world_size(int world) const {
  FlatParamLayout l = *this;
  l.finish(world);
  return l;
}

nlohmann::json FlatParamLayout::to_json() const {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& e : entries_)
    params.push_back({{"name", e.name}, {"shape", e.shape}, {"numel", e.numel}, {"offset", e.offset}});
  return {{"world_size", world_}, {"total", total_}, {"padded_total", padded_}, {"shard_size", shard_size()},
          {"params", params}};
}

FlatParamLayout FlatParamLayout::from_json(const nlohmann::json& j) {
  try {
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : j.at("params")) {
      names.push_back(p.at("name").get<std::string>());
      shapes.push_back(p.at("shape").get<std::vector<int64_t>>());
    }
    FlatParamLayout l(names, shapes, j.at("world_size").get<int>());
    for (size_t i = 0; i < l.entries_.size(); ++i) {
      const auto& p = j.at("params")[i];
      if (p.at("offset").get<int64_t>() != l.entries_[i].offset || p.at("numel").get<int64_t>() != l.entries_[i].numel)
        throw std::runtime_error("offset/numel of '" + names[i] + "' disagree with its shape and order");
    }
    if (j.at("total").get<int64_t>() != l.total_ || j.at("padded_total").get<int64_t>() != l.padded_)
      throw std::runtime_error("total/padded_total disagree with the params");
    return l;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("parallel/flat_params: bad layout json: ") + e.what());
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("parallel/flat_params: bad layout json: ") + e.what());
  }
}

at::Tensor read_range(const FlatParamLayout& layout, const std::vector<at::Tensor>& shards, int64_t begin,
                      int64_t end) {
  if (static_cast<int>(shards.size()) != layout.world_size())
    throw std::runtime_error("parallel/flat_params: read_range got " + std::to_string(shards.size()) +
                             " shards for a layout of world " + std::to_string(layout.world_size()));
  if (begin < 0 || begin > end || end > layout.total())
    throw std::runtime_error("parallel/flat_params: read_range [" + std::to_string(begin) + ", " +
                             std::to_string(end) + ") outside [0, " + std::to_string(layout.total()) + ")");
  if (shards.empty()) throw std::runtime_error("parallel/flat_params: read_range without shards");
  at::Tensor out = at::empty({end - begin}, shards[0].options());
  const int64_t s = layout.shard_size();
  for (int r = 0; r < layout.world_size() && begin < end; ++r) {
    auto [vb, ve] = layout.valid_range(r);
    const at::Tensor& sh = shards[r];
    if (sh.dim() != 1 || (sh.numel() != s && sh.numel() != ve - vb))
      throw std::runtime_error("parallel/flat_params: shard " + std::to_string(r) + " has " +
                               std::to_string(sh.numel()) + " elements, expected " + std::to_string(s) +
                               " (padded) or " + std::to_string(ve - vb));
    const int64_t b = std::max(begin, vb), e = std::min(end, ve);
    if (b >= e) continue;
    out.narrow(0, b - begin, e - b).copy_(sh.narrow(0, b - r * s, e - b));
  }
  return out;
}

std::vector<at::Tensor> reshard_flat(const FlatParamLayout& layout, const std::vector<at::Tensor>& shards,
                                     int new_world) {
  FlatParamLayout nl = layout.with_world_size(new_world);
  std::vector<at::Tensor> out;
  for (int r = 0; r < new_world; ++r) {
    at::Tensor sh = at::zeros({nl.shard_size()}, shards.at(0).options());
    auto [vb, ve] = nl.valid_range(r);
    if (vb < ve) sh.narrow(0, 0, ve - vb).copy_(read_range(layout, shards, vb, ve));
    out.push_back(sh);
  }
  return out;
}

}  // namespace gmod

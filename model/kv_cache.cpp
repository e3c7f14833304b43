// Growable KV caches written in place: slot views over [B, Hkv, C, Dh] buffers (model/kv_cache.h).
#include "model/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gmod {

namespace {
// t [B, H, T, D] copied into the first T slots of a fresh zeroed [B, H, C, D] buffer; returns the slot view.
at::Tensor relaid(const at::Tensor& t, int64_t C) {
  auto buf = at::zeros({t.size(0), t.size(1), C, t.size(3)}, t.options());
  auto view = buf.narrow(2, 0, t.size(2));
  view.copy_(t);
  return view;
}

// The first `slots` slots of the buffer behind the slot view t (kv_capacity(t) >= slots).
at::Tensor widened(const at::Tensor& t, int64_t slots) {
  return t.as_strided({t.size(0), t.size(1), slots, t.size(3)}, t.strides(), t.storage_offset());
}

void check_pair(const KVCache& c) {
  if (c.k.defined() != c.v.defined() || (c.k.defined() && (c.k.dim() != 4 || c.v.dim() != 4 ||
                                                            c.k.size(2) != c.v.size(2) || c.k.size(0) != c.v.size(0))))
    throw std::logic_error("KV cache: k and v must both be [B, Hkv, T, Dh] with the same B and T");
}
}  // namespace

int64_t kv_capacity(const at::Tensor& k) {
  if (!k.defined()) return 0;
  const int64_t T = k.size(2);
  if (k.dim() != 4) return T;
  const int64_t B = k.size(0), H = k.size(1), D = k.size(3);
  if (D == 0 || k.stride(3) != 1 || k.stride(2) != D || k.stride(1) % D != 0) return T;
  const int64_t C = k.stride(1) / D;
  if (C <= T || k.stride(0) != H * C * D) return T;
  // The whole buffer must lie inside the storage (a slot view made here always does).
  const int64_t end = k.storage_offset() + B * H * C * D;
  if (end * static_cast<int64_t>(k.itemsize()) > static_cast<int64_t>(k.storage().nbytes())) return T;
  return C;
}

void kv_reserve(KVCache& c, int64_t capacity) {
  check_pair(c);
  if (!c.k.defined()) return;
  capacity = std::max(capacity, c.length());
  if (kv_capacity(c.k) >= capacity && kv_capacity(c.v) >= capacity) return;
  c.k = relaid(c.k, capacity);
  c.v = relaid(c.v, capacity);
}

void kv_grow(KVCache& c, int64_t slots) {
  check_pair(c);
  if (!c.k.defined()) throw std::logic_error("KV cache: kv_grow needs a filled cache (the prefill fills it)");
  const int64_t T = c.length();
  if (slots <= T) return;
  if (kv_capacity(c.k) < slots || kv_capacity(c.v) < slots) kv_reserve(c, std::max(slots, 2 * T));
  c.k = widened(c.k, slots);
  c.v = widened(c.v, slots);
}

void kv_append(KVCache& c, const at::Tensor& k, const at::Tensor& v) {
  if (!c.k.defined()) {  // prefill: the projections themselves (generate() reserves room after it)
    c.k = k;
    c.v = v;
    return;
  }
  const int64_t T = c.length(), L = k.size(2);
  kv_grow(c, T + L);
  c.k.narrow(2, T, L).copy_(k);
  c.v.narrow(2, T, L).copy_(v);
}

}  // namespace gmod

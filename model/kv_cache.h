// Growable KV caches written in place (generation): a KVCache's k, v [B, Hkv, T, Dh] may be the first T slots of
// [B, Hkv, C, Dh] buffers ("slot views", C >= T, read from the strides: C = k.stride(1) / Dh). A decode step then
// writes its new keys and values into slot T (dense) or into each sample's own next slot (MoD layers, per-sample
// lengths) without copying the cache: the old cat-per-step copied every layer's whole cache at every token, O(T^2)
// over a generation. Attention reads the slot views directly (SDPA takes strided keys and values).
//
// Only kv_reserve and kv_grow make slot views, over buffers nothing else references; any other k (a fresh prefill
// tensor) reports capacity T, so the first append re-lays it out (one copy) with room to grow geometrically.
#pragma once

#include "model/layers.h"

namespace gmod {

// Slots the buffer behind `k` [B, Hkv, T, Dh] has per sample: C for a slot view, else T (no room to write into).
int64_t kv_capacity(const at::Tensor& k);

// Re-lays out c's k and v as slot views of buffers with `capacity` slots (>= length()); one copy of the cache, none
// when it already has that room. An empty cache stays empty.
void kv_reserve(KVCache& c, int64_t capacity);

// Appends k, v [B, Hkv, L, Dh] at slot length() in place, growing (x2) only when the buffer is full.
void kv_append(KVCache& c, const at::Tensor& k, const at::Tensor& v);

// Makes c.k, c.v views of at least `slots` slots, growing (x2) only when the buffer is full. Slots never written hold
// zeros (finite, so that masked keys weigh exactly 0); callers with per-sample lengths mask them.
void kv_grow(KVCache& c, int64_t slots);

}  // namespace gmod

// Python-compatible MT19937 (see py_random.h): the reference init_genrand/init_by_array/genrand_int32.
#include "eval/py_random.h"

namespace gmod::eval {

PyRandom::PyRandom(uint32_t seed) {
  // init_genrand(19650218)
  mt_[0] = 19650218u;
  for (int k = 1; k < 624; ++k)
    mt_[k] = 1812433253u * (mt_[k - 1] ^ (mt_[k - 1] >> 30)) + static_cast<uint32_t>(k);
  // init_by_array({seed}): Python passes abs(n) as 32-bit words, one word for seeds < 2^32
  const uint32_t key[1] = {seed};
  const int key_len = 1;
  int i = 1, j = 0;
  for (int k = 624; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i, ++j;
    if (i >= 624) mt_[0] = mt_[623], i = 1;
    if (j >= key_len) j = 0;
  }
  for (int k = 623; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= 624) mt_[0] = mt_[623], i = 1;
  }
  mt_[0] = 0x80000000u;
  i_ = 624;
}

uint32_t PyRandom::next() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kA = 0x9908b0dfu;
  if (i_ >= 624) {
    int k = 0;
    for (; k < 624 - 397; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
      mt_[k] = mt_[k + 397] ^ (y >> 1) ^ ((y & 1u) ? kA : 0u);
    }
    for (; k < 623; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
      mt_[k] = mt_[k + 397 - 624] ^ (y >> 1) ^ ((y & 1u) ? kA : 0u);
    }
    const uint32_t y = (mt_[623] & kUpper) | (mt_[0] & kLower);
    mt_[623] = mt_[396] ^ (y >> 1) ^ ((y & 1u) ? kA : 0u);
    i_ = 0;
  }
  uint32_t y = mt_[i_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PyRandom::getrandbits(int k) { return next() >> (32 - k); }

uint32_t PyRandom::below(uint32_t n) {
  int k = 0;
  while ((n >> k) != 0 && k < 32) ++k;  // n.bit_length()
  uint32_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

}  // namespace gmod::eval

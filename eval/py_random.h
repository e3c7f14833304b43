// Python's `random` module as far as MMMU's scorer uses it: random.seed(int) (MT19937 seeded by init_by_array
// with the integer's 32-bit words) and random.choice (getrandbits with rejection), so the answers MMMU's
// parse_multi_choice_response picks at random come out the same as in Python, in the same call order.
#pragma once

#include <array>
#include <cstdint>

namespace gmod::eval {

class PyRandom {
 public:
  explicit PyRandom(uint32_t seed);
  // random.getrandbits(k) for 0 < k <= 32.
  uint32_t getrandbits(int k);
  // The index random.choice picks from a sequence of n > 0 items (_randbelow).
  uint32_t below(uint32_t n);

 private:
  uint32_t next();
  std::array<uint32_t, 624> mt_{};
  int i_ = 625;
};

}  // namespace gmod::eval

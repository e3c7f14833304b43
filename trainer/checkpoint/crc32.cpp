#include "trainer/checkpoint/crc32.h"

#include <isa-l/crc.h>

namespace gmod {

uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc) {
  // crc32_gzip_refl takes and returns the finished (complemented) value, as zlib's crc32 does.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), uint64_t(n));
}

}  // namespace gmod

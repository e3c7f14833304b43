// CRC-32 of checkpoint bytes: zlib's value (the gzip polynomial, reflected), computed with Intel ISA-L's
// carry-less-multiply kernel (Debian's libisal-dev), which picks the CPU's widest variant at run time. On this
// project's 2-core machines it runs at ~12 GB/s against zlib's ~1.9 GB/s (bench/bench_checkpoint.py prints both), so a
// save's or a resume's checksum no longer bounds it: every tensor is checksummed once, in the pass that writes or
// reads it. tests/trainer/test_direct_write.cpp compares the value with zlib's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gmod {

// CRC-32 of a byte range, continuing from `crc` (0 to start): crc32_bytes(b, n1 + n2) ==
// crc32_bytes(b + n1, n2, crc32_bytes(b, n1)).
uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc = 0);

}  // namespace gmod

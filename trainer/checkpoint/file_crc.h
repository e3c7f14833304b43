// CRC-32 of checkpoint files: of a whole file read in parallel ranges, and of a file whose large regions' CRCs are
// already known (the tensor data a save just wrote, checksummed once while writing), reading only the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gmod {

// A byte range of a file whose CRC-32 is known: [offset, offset + bytes) has zlib CRC-32 `crc`.
struct KnownCrcRegion {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// CRC-32 and size of a whole file, read in up to 8 parallel ranges (crc32_combine: the same value as one pass);
// throws naming the file when it cannot be read.
uint32_t crc32_file(const std::string& path, uint64_t* size_out = nullptr);

// The same value as crc32_file, reading only the bytes outside `known` (which must not overlap and must lie inside
// the file; otherwise the whole file is read, and *used_regions says so). A save writes each tensor's bytes once,
// computing their CRC as it goes (the dataset's crc32 attribute): the file's CRC then costs a read of HDF5's
// metadata only, not a second pass over gigabytes.
uint32_t crc32_file_with_known(const std::string& path, std::vector<KnownCrcRegion> known,
                               uint64_t* size_out = nullptr, bool* used_regions = nullptr);

// Reads [offset, offset + bytes) of `path` into dst and returns its CRC-32, each 1 MiB piece checksummed right after
// it is read, while it is still in the CPU's cache (one pass over memory, not a read and then a second pass); large
// regions in parallel ranges (joined with crc32_combine: the value of one sequential pass). A resume reads each
// contiguous dataset this way. Throws naming the file when it cannot be read or ends early.
uint32_t read_file_region_crc(const std::string& path, uint64_t offset, uint64_t bytes, void* dst);

}  // namespace gmod

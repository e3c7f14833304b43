// CheckpointManager's checks of a checkpoint directory against its manifest: the whole directory (verify), one file
// (verify_file), and the resume's metadata-only check (verify_file_deferring_data). See checkpoint.h.
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"

#include "trainer/checkpoint/file_crc.h"
#include "trainer/checkpoint/hdf5_file.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace gmod {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace checkpoint_files;

std::string CheckpointManager::verify(const std::string& step_dir, bool checksums) {
  const fs::path dir(step_dir);
  const fs::path mpath = dir / kManifest;
  if (!fs::exists(mpath)) return "no " + std::string(kManifest) + " (incomplete save)";
  json m;
  try {
    m = read_json_file(mpath.string());
    if (m.value("format", "") != kFormat) return "manifest.json is not a " + std::string(kFormat) + " manifest";
    int64_t step = m.at("step").get<int64_t>();
    int64_t dir_step = parse_step_dir(dir.filename().string());
    if (dir_step >= 0 && dir_step != step)
      return "manifest.json says step " + std::to_string(step) + " but the directory is " + dir.filename().string();
    const json& w = m.at("world_size");
    if (!w.is_number_integer() || w.get<int64_t>() < 1 || w.get<int64_t>() > (1 << 20))
      return "manifest.json world_size " + w.dump() + " is not a rank count (1 or more)";
    const int world = w.get<int>();
    const json& files = m.at("files");
    // Exactly one optimizer file per rank 0..world_size-1: a world_size that disagrees with the files is
    // named here, instead of failing later when the optimizer state is resharded.
    int listed = 0;
    for (const auto& [fname, info] : files.items()) {
      (void)info;
      if (fname.rfind("optim-rank-", 0) != 0 || fname.size() < 15 ||
          fname.compare(fname.size() - 3, 3, ".h5") != 0)
        continue;
      ++listed;
      const std::string idx = fname.substr(11, fname.size() - 14);
      if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos || std::stoll(idx) >= world)
        return "manifest.json is inconsistent: world_size " + std::to_string(world) + " but it lists " +
               fname;
    }
    if (listed != world)
      return "manifest.json is inconsistent: world_size " + std::to_string(world) +
             " but it lists the optimizer files of " + std::to_string(listed) + " rank(s)";
    std::vector<std::string> required{kModelFile, kStateFile};
    for (int r = 0; r < world; ++r) required.push_back(optim_file(r));
    for (const auto& f : required)
      if (!files.contains(f)) return "manifest.json does not list " + f;
    for (const auto& [fname, info] : files.items()) {
      std::string why = check_file(dir, fname, info, checksums);
      if (!why.empty()) return why;
    }
  } catch (const std::exception& e) {
    return std::string("unreadable manifest or file: ") + e.what();
  }
  return "";
}

std::string CheckpointManager::check_file(const std::filesystem::path& dir, const std::string& fname,
                                          const nlohmann::json& info, bool checksums, bool defer_data) {
  const fs::path p = dir / fname;
  std::error_code ec;
  uint64_t size = fs::file_size(p, ec);
  if (ec) return fname + " is missing";
  uint64_t want = info.at("bytes").get<uint64_t>();
  if (size != want)
    return fname + " has " + std::to_string(size) + " bytes, manifest says " + std::to_string(want) + " (truncated?)";
  if (checksums) {
    uint32_t value = 0;
    if (defer_data && fname.size() > 3 && fname.compare(fname.size() - 3, 3, ".h5") == 0) {
      std::vector<KnownCrcRegion> known;
      {
        const H5File f = H5File::open(p.string());
        known = f.checksummed_regions(CheckpointReader::kDeferredCrcBytes);
      }
      value = crc32_file_with_known(p.string(), std::move(known));
    } else {
      value = crc32_file(p.string());
    }
    std::string crc = hex32(value);
    if (crc != info.at("crc32").get<std::string>())
      return fname + " CRC-32 " + crc + " does not match manifest " + info.at("crc32").get<std::string>() +
             " (corrupt)";
  }
  return "";
}

std::vector<std::string> CheckpointManager::manifest_files(const std::string& step_dir) {
  std::vector<std::string> out;
  const json m = read_json_file((fs::path(step_dir) / kManifest).string());
  for (const auto& [fname, info] : m.at("files").items()) out.push_back(fname);
  return out;  // nlohmann's object order: sorted by name, the same on every rank
}

std::string CheckpointManager::verify_file(const std::string& step_dir, const std::string& fname) {
  try {
    const json m = read_json_file((fs::path(step_dir) / kManifest).string());
    return check_file(step_dir, fname, m.at("files").at(fname), true);
  } catch (const std::exception& e) {
    return fname + ": " + e.what();
  }
}

std::string CheckpointManager::verify_file_deferring_data(const std::string& step_dir, const std::string& fname) {
  try {
    const json m = read_json_file((fs::path(step_dir) / kManifest).string());
    return check_file(step_dir, fname, m.at("files").at(fname), true, /*defer_data=*/true);
  } catch (const std::exception& e) {
    return fname + ": " + e.what();
  }
}

}  // namespace gmod

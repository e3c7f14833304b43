// Names of the files inside a checkpoint step directory and the JSON reader shared by the checkpoint writer
// and manager (checkpoint.cpp) and the reader (checkpoint_reader.cpp). Internal to trainer/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gmod::checkpoint_files {

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kModelFile = "model.h5";
inline constexpr const char* kStateFile = "trainer-state.json";
inline constexpr const char* kFormat = "gmod-checkpoint";

inline std::string optim_file(int rank) { return "optim-rank-" + std::to_string(rank) + ".h5"; }
inline std::string sum_file(int rank) { return optim_file(rank) + ".sum"; }

// Parses a JSON file; a missing or malformed file is an error naming it.
nlohmann::json read_json_file(const std::string& path);

}  // namespace gmod::checkpoint_files

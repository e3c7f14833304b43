// Names of the files inside a checkpoint step directory and the small helpers (JSON reader, CRC text, step directory
// names) shared by the checkpoint writer and manager (checkpoint.cpp, checkpoint_verify.cpp) and the reader
// (checkpoint_reader.cpp). Internal to trainer/.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gmod::checkpoint_files {

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kModelFile = "model.h5";
inline constexpr const char* kStateFile = "trainer-state.json";
inline constexpr const char* kFormat = "gmod-checkpoint";

inline std::string optim_file(int rank) { return "optim-rank-" + std::to_string(rank) + ".h5"; }
inline std::string sum_file(int rank) { return optim_file(rank) + ".sum"; }
// Rank r's share of the model weights (r >= 1; rank 0's share is in model.h5 with the index of all of them).
inline std::string model_part_file(int rank) { return "model-rank-" + std::to_string(rank) + ".h5"; }

// The files holding model weights in step directory `dir` and the tensor names each holds: model.h5 alone (all
// its tensor_names) for a checkpoint written whole by rank 0, else model.h5's own_tensor_names and every file of
// its `parts` attribute with their tensor_names. Errors name the file.
std::vector<std::pair<std::string, std::vector<std::string>>> model_part_index(const std::string& dir);

// Parses a JSON file; a missing or malformed file is an error naming it.
nlohmann::json read_json_file(const std::string& path);

// A CRC-32 as the manifest writes it: 8 lower-case hex digits.
std::string hex32(uint32_t v);

// Parses "step-<digits>" exactly; -1 otherwise.
int64_t parse_step_dir(const std::string& name);

}  // namespace gmod::checkpoint_files

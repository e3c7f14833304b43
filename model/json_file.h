// JSON files of model directories (config.json, tokenizer and processor configs): read with errors naming the file,
// written atomically (a temporary beside it, then a rename), so a reader never sees half a file.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace gmod {

// Throws std::runtime_error "<path>: cannot open" or "<path>: not valid JSON: <why>".
nlohmann::json load_json_file(const std::string& path);
// Writes `j` indented by 2 with a final newline; throws std::runtime_error naming the path when it cannot.
void save_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace gmod

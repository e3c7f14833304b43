// The records a scorer reads (answer and annotation files: JSON lines, JSON documents, TSV tables) and the
// problems it finds in them. A problem names its record ("answers.jsonl:12", "output.json[#3]") and what was
// wrong; scorers count and list every one instead of dropping a record silently from a denominator.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gmod::eval {

using Json = nlohmann::ordered_json;  // keeps the files' key order (MMMU's index2ans is an ordered dict)

struct Problem {
  std::string where;  // file:line or file[#index]
  std::string what;
};

// Sorts problems by file (in the order each file's first problem was found: the answers before the annotations), then
// line or position ("a.jsonl:9" before "a.jsonl:10"), stably.
void sort_problems(std::vector<Problem>* problems);

struct Record {
  Json value;
  std::string where;
};

// One JSON object per line. A line that is blank, not JSON or not an object is a problem (the Python
// originals stop there); the rest are returned in file order. Throws std::runtime_error naming the file when
// it cannot be read.
std::vector<Record> read_jsonl(const std::string& path, std::vector<Problem>* problems);
// A whole JSON document; throws std::runtime_error naming the file (and JSON's message) when it is
// unreadable.
Json read_json(const std::string& path);
// The elements of a JSON list (a .json file holding a list) or the lines of a JSON-lines file, each an
// object.
std::vector<Record> read_records(const std::string& path, std::vector<Problem>* problems);

// A tab-separated table with a header row (MMBench's TSV), read as text: a cell that starts with '"' is
// quoted (embedded tabs and newlines, "" for a quote), as pandas reads it. Rows are name -> cell; `where` is
// file:line.
struct TsvRow {
  std::vector<std::pair<std::string, std::string>> cells;
  std::string where;
  const std::string* get(const std::string& name) const;
};
std::vector<TsvRow> read_tsv(const std::string& path, std::vector<Problem>* problems);

// The string field `key` of `r`, or nullptr with a problem "no string 'key'" added.
const std::string* string_field(const Record& r, const char* key, std::vector<Problem>* problems);
// A question id as a Python dict key: equal ids give equal keys, as Python's == (1 and 1.0 are one key, the
// string "1" another). Returns "" (and adds a problem) for a missing id or one that is a list/object/null.
std::string id_key(const Record& r, const char* key, std::vector<Problem>* problems);
std::string id_key(const Json& id);  // "" when not a string or number
// The id as written (strings without quotes), for messages.
std::string id_text(const Json& id);

}  // namespace gmod::eval

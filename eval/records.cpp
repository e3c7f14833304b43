// Reading answer and annotation records with named problems (see records.h).
#include "eval/records.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace gmod::eval {
namespace {

std::ifstream open_or_throw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open for reading");
  return f;
}

}  // namespace

void sort_problems(std::vector<Problem>* problems) {
  auto key = [](const std::string& w) {
    const size_t c = w.find_last_of(":[#");
    const std::string num = c == std::string::npos ? "" : w.substr(c + 1);
    const bool numeric = !num.empty() && num.find_first_not_of("0123456789]") == std::string::npos;
    return std::make_pair(numeric ? w.substr(0, c) : w, numeric ? std::stoll(num) : -1LL);
  };
  // Files in the order their first problem was found (the answers file, read first, before the annotations' "no
  // answer" problems), then line or position within a file.
  std::map<std::string, size_t> file_order;
  for (const Problem& p : *problems) file_order.emplace(key(p.where).first, file_order.size());
  std::stable_sort(problems->begin(), problems->end(), [&](const Problem& a, const Problem& b) {
    const auto ka = key(a.where), kb = key(b.where);
    const size_t fa = file_order.at(ka.first), fb = file_order.at(kb.first);
    return fa != fb ? fa < fb : ka.second < kb.second;
  });
}

std::vector<Record> read_jsonl(const std::string& path, std::vector<Problem>* problems) {
  std::ifstream f = open_or_throw(path);
  std::vector<Record> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      problems->push_back({where, "blank line"});
      continue;
    }
    Json v = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
      problems->push_back({where, "not JSON"});
    } else if (!v.is_object()) {
      problems->push_back({where, "not a JSON object"});
    } else {
      out.push_back({std::move(v), where});
    }
  }
  return out;
}

Json read_json(const std::string& path) {
  std::ifstream f = open_or_throw(path);
  try {
    return Json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not a JSON document (" + e.what() + ")");
  }
}

std::vector<Record> read_records(const std::string& path, std::vector<Problem>* problems) {
  std::ifstream f = open_or_throw(path);
  char c = 0;
  while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  if (c != '[') return read_jsonl(path, problems);
  const Json doc = read_json(path);
  std::vector<Record> out;
  for (size_t i = 0; i < doc.size(); ++i) {
    const std::string where = path + "[#" + std::to_string(i) + "]";
    if (!doc[i].is_object())
      problems->push_back({where, "not a JSON object"});
    else
      out.push_back({doc[i], where});
  }
  return out;
}

const std::string* TsvRow::get(const std::string& name) const {
  for (const auto& [k, v] : cells)
    if (k == name) return &v;
  return nullptr;
}

std::vector<TsvRow> read_tsv(const std::string& path, std::vector<Problem>* problems) {
  std::ifstream f = open_or_throw(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  // Split into rows of cells; quoted cells may hold tabs and newlines.
  std::vector<std::pair<std::vector<std::string>, int64_t>> rows;  // cells, first line
  std::vector<std::string> cells(1);
  int64_t line = 1, row_line = 1;
  bool at_cell_start = true;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (at_cell_start && c == '"') {
      at_cell_start = false;
      for (++i; i < text.size(); ++i) {
        if (text[i] == '"' && i + 1 < text.size() && text[i + 1] == '"')
          cells.back() += '"', ++i;
        else if (text[i] == '"')
          break;
        else {
          if (text[i] == '\n') ++line;
          cells.back() += text[i];
        }
      }
      continue;
    }
    at_cell_start = false;
    if (c == '\t') {
      cells.emplace_back(), at_cell_start = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (!(cells.size() == 1 && cells[0].empty())) rows.emplace_back(std::move(cells), row_line);
      cells.assign(1, std::string());
      at_cell_start = true;
      row_line = ++line;
    } else {
      cells.back() += c;
    }
  }
  if (!(cells.size() == 1 && cells[0].empty())) rows.emplace_back(std::move(cells), row_line);
  if (rows.empty()) throw std::runtime_error(path + ": empty table (no header row)");
  const std::vector<std::string>& header = rows[0].first;
  std::vector<TsvRow> out;
  for (size_t r = 1; r < rows.size(); ++r) {
    const std::string where = path + ":" + std::to_string(rows[r].second);
    if (rows[r].first.size() != header.size()) {
      problems->push_back({where, std::to_string(rows[r].first.size()) + " cells, the header has " +
                                      std::to_string(header.size())});
      continue;
    }
    TsvRow row;
    row.where = where;
    for (size_t k = 0; k < header.size(); ++k) row.cells.emplace_back(header[k], rows[r].first[k]);
    out.push_back(std::move(row));
  }
  return out;
}

const std::string* string_field(const Record& r, const char* key, std::vector<Problem>* problems) {
  const auto it = r.value.find(key);
  if (it == r.value.end() || !it->is_string()) {
    problems->push_back({r.where, std::string("no string '") + key + "'"});
    return nullptr;
  }
  return &it->get_ref<const std::string&>();
}

std::string id_key(const Json& id) {
  if (id.is_string()) return "s:" + id.get<std::string>();
  if (id.is_boolean()) return id.get<bool>() ? "n:1" : "n:0";  // Python: True == 1
  if (id.is_number_integer()) return "n:" + id.dump();
  if (id.is_number_float()) {
    const double x = id.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9.0e15)
      return "n:" + std::to_string(static_cast<int64_t>(x));
    return "n:" + id.dump();
  }
  return "";
}

std::string id_key(const Record& r, const char* key, std::vector<Problem>* problems) {
  const auto it = r.value.find(key);
  const std::string k = it == r.value.end() ? std::string() : id_key(*it);
  if (k.empty()) problems->push_back({r.where, std::string("no '") + key + "' (a string or a number)"});
  return k;
}

std::string id_text(const Json& id) { return id.is_string() ? id.get<std::string>() : id.dump(); }

}  // namespace gmod::eval

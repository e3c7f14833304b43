// TensorBoard event files: see tensorboard_events.h.
#include "trainer/tensorboard_events.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace gmod {
namespace {

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> x{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
      x[i] = c;
    }
    return x;
  }();
  return t;
}

// Protocol buffer wire format: varints, tags, length-delimited fields, fixed 32/64-bit little-endian values.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void tag(std::string& out, int field, int wire) { varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
void bytes_field(std::string& out, int field, const std::string& b) {
  tag(out, field, 2);
  varint(out, b.size());
  out += b;
}
template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}

// Event {double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//        SessionLog session_log = 7;}  Summary {repeated Value value = 1;}  Value {string tag = 1;
//        float simple_value = 2;}  SessionLog {SessionStatus status = 1;}  (START = 1)
std::string event_head(int64_t step) {
  std::string e;
  tag(e, 1, 1);
  fixed(e, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  tag(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

void flatten_into(const nlohmann::json& j, const std::string& prefix,
                  std::vector<std::pair<std::string, float>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string name = prefix + it.key();
    const nlohmann::json& v = it.value();
    if (v.is_object()) flatten_into(v, name + "/", out);
    else if (v.is_boolean()) out.emplace_back(name, v.get<bool>() ? 1.0f : 0.0f);
    else if (v.is_number()) out.emplace_back(name, v.get<float>());
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resume_step,
                                     std::function<void(const std::string&)> warn)
    : warn_(std::move(warn)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  const long long secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." +
                                         std::to_string(::getpid()) + ".gmod"))
              .string();
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_)
    throw std::runtime_error("metrics.tensorboard: cannot create " + path_ + ": " + std::strerror(errno));
  std::string e = event_head(0);
  bytes_field(e, 3, "brain.Event:2");
  record(e);
  if (resume_step > 0) {
    std::string s = event_head(resume_step + 1), log;
    tag(log, 1, 0);
    varint(log, 1);  // SessionLog.START
    bytes_field(s, 7, log);
    record(s);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

std::vector<std::pair<std::string, float>> TensorBoardWriter::flatten(const nlohmann::json& j,
                                                                      const std::string& prefix) {
  std::vector<std::pair<std::string, float>> out;
  if (!j.is_object()) return out;
  nlohmann::json rest = j;
  if (prefix.empty()) rest.erase("step");
  flatten_into(rest, prefix, out);
  return out;
}

void TensorBoardWriter::scalars(int64_t step, const nlohmann::json& j, const std::string& prefix) {
  std::string summary;
  for (const auto& [name, v] : flatten(j, prefix)) {
    std::string value;
    bytes_field(value, 1, name);
    tag(value, 2, 5);
    fixed(value, v);
    bytes_field(summary, 1, value);
  }
  if (summary.empty()) return;
  std::string e = event_head(step);
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(const std::string& event) {
  if (failed_ || !f_) return;
  std::string r;
  const uint64_t n = event.size();
  fixed(r, n);
  fixed(r, masked_crc32c(r.data(), 8));
  r += event;
  fixed(r, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size() || std::fflush(f_) != 0) {
    failed_ = true;
    if (warn_)
      warn_("warning: metrics.tensorboard: cannot write " + path_ + ": " + std::strerror(errno) +
            "; no more TensorBoard events this run (metrics.jsonl goes on)");
  }
}

}  // namespace gmod

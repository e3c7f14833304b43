#include "trainer/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <vector>

#include "trainer/peak_flops.h"
#include "trainer/tensorboard_events.h"

#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace gmod {

double default_peak_tflops(const at::Device& device, at::ScalarType dtype) {
  if (device
          .is_cuda()) {  // the device's datasheet figure (trainer/peak_flops.h); 0 for a GPU the table lacks
    const PeakFlops p = peak_flops_of(cuda_device_name(device.has_index() ? device.index() : -1));
    return dtype == at::kBFloat16 ? p.bf16_tflops : p.fp32_tflops;
  }
  return 1.0;
}

namespace {

double rss_mb() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--:--";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60),
                (long long)(t % 60));
  return buf;
}

// A redrawn bar only on a real terminal: mpirun hands ranks a pseudo-terminal even when its own output goes to a
// file, so under MPI launchers plain lines are the default. GMOD_PROGRESS=bar|plain overrides.
bool progress_bar_wanted() {
  if (const char* p = std::getenv("GMOD_PROGRESS")) return std::string(p) == "bar";
  if (std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("PMI_RANK")) return false;
  return isatty(STDOUT_FILENO) != 0;
}

}  // namespace

nlohmann::json memory_stats(const at::Device& device) {
  nlohmann::json j{{"rss_mb", std::round(rss_mb() * 10) / 10}};
#ifdef GMOD_WITH_CUDA
  if (device.is_cuda()) {
    using namespace c10::cuda::CUDACachingAllocator;
    const auto s = getDeviceStats(device.has_index() ? device.index() : 0);
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const double mb = 1024.0 * 1024.0;
    j["cuda_alloc_mb"] = std::round(double(s.allocated_bytes[agg].current) / mb);
    j["cuda_peak_alloc_mb"] = std::round(double(s.allocated_bytes[agg].peak) / mb);
    j["cuda_reserved_mb"] = std::round(double(s.reserved_bytes[agg].current) / mb);
    // Peak reserved beside peak allocated: blocks freed with recordStream (buckets, ZeRO-3 units) stay reserved
    // until the communication stream passes them, which only the reserved figure shows.
    j["cuda_peak_reserved_mb"] = std::round(double(s.reserved_bytes[agg].peak) / mb);
    j["cuda_alloc_retries"] = s.num_alloc_retries;
    j["cuda_ooms"] = s.num_ooms;
  }
#else
  (void)device;
#endif
  return j;
}

std::string MetricsLogger::repair_torn_tail(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "";
    throw std::runtime_error("metrics: cannot open " + path + ": " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) throw std::runtime_error("metrics: cannot stat " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return "";  // a device or pipe: nothing to repair
  const off_t size = st.st_size;
  char last = '\n';
  if (size == 0 || (::pread(fd, &last, 1, size - 1) == 1 && last == '\n')) return "";
  // The start of the last line: after the last newline, searched backwards in blocks.
  off_t start = 0;
  std::vector<char> buf(1 << 16);
  for (off_t end = size; end > 0 && start == 0;) {
    const off_t begin = std::max<off_t>(0, end - off_t(buf.size()));
    const ssize_t n = ::pread(fd, buf.data(), size_t(end - begin), begin);
    if (n != ssize_t(end - begin)) throw std::runtime_error("metrics: cannot read " + path + ": " + std::strerror(errno));
    for (ssize_t i = n - 1; i >= 0; --i)
      if (buf[size_t(i)] == '\n') {
        start = begin + i + 1;
        break;
      }
    end = begin;
  }
  std::string tail(size_t(size - start), '\0');
  if (::pread(fd, tail.data(), tail.size(), start) != ssize_t(tail.size()))
    throw std::runtime_error("metrics: cannot read " + path + ": " + std::strerror(errno));
  bool complete = false;
  try {
    complete = nlohmann::json::parse(tail).is_object();
  } catch (const std::exception&) {
  }
  if (complete) {
    if (::pwrite(fd, "\n", 1, size) != 1)
      throw std::runtime_error("metrics: cannot repair " + path + ": " + std::strerror(errno));
    return "metrics: " + path + ": its last line lacked a newline (an interrupted write); added it";
  }
  if (::ftruncate(fd, start) != 0)
    throw std::runtime_error("metrics: cannot repair " + path + ": " + std::strerror(errno));
  std::string preview = tail.substr(0, 60);
  for (char& c : preview)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return "metrics: " + path + ": removed a torn last line of " + std::to_string(tail.size()) +
         " bytes left by an interrupted write ('" + preview + (tail.size() > 60 ? "...'" : "'") + ")";
}

MetricsLogger::MetricsLogger(const std::string& run_dir, bool enabled, double peak_flops, int64_t first_step,
                             int max_write_failures)
    : enabled_(enabled), tty_(progress_bar_wanted()), peak_flops_(peak_flops), first_step_(first_step),
      max_write_failures_(std::max(1, max_write_failures)), start_(std::chrono::steady_clock::now()) {
  if (!enabled_) return;
  std::filesystem::create_directories(run_dir);
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  const std::string repaired = repair_torn_tail(path_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("metrics: cannot open " + path_ + " for appending: " + std::strerror(errno));
  if (!repaired.empty()) print(repaired);
}

MetricsLogger::~MetricsLogger() {
  if (enabled_) finish();
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLogger::write(const nlohmann::json& j) {
  const std::string line = (newline_first_ ? "\n" : "") + j.dump() + '\n';
  struct stat st;
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += size_t(n);
  }
  if (done == line.size()) {
    newline_first_ = false;
    if (failures_in_row_ > 0)
      print("metrics: writing " + path_ + " works again after " + std::to_string(failures_in_row_) +
            " failed write(s); those lines are missing");
    failures_in_row_ = 0;
    return;
  }
  // Undo a partial line; if that fails too, the next line starts on a new line instead of gluing onto it.
  if (done > 0 && !(before >= 0 && ::ftruncate(fd_, before) == 0)) newline_first_ = true;
  ++failures_total_;
  ++failures_in_row_;
  const std::string why = std::strerror(err);
  if (failures_in_row_ >= max_write_failures_)
    throw std::runtime_error("metrics: " + std::to_string(failures_in_row_) + " writes to " + path_ +
                             " in a row failed (last: " + why + "); stopping rather than training unobserved");
  if (failures_in_row_ == 1)
    print("warning: metrics: cannot write " + path_ + ": " + why + "; this line is lost, training goes on (" +
          std::to_string(max_write_failures_) + " failures in a row stop it)");
}

nlohmann::json MetricsLogger::log(const StepMetrics& m, const nlohmann::json& memory) {
  const double t = std::max(m.step_seconds, 1e-9);
  const double mfu = peak_flops_ > 0 ? m.flops / t / peak_flops_ : 0.0;
  nlohmann::json j{{"step", m.step},
                   {"loss", m.loss},
                   {"lm_loss", m.lm_loss},
                   {"routing_loss", m.routing_loss},
                   {"grad_norm", m.grad_norm},
                   {"lr", m.lr},
                   {"samples", m.samples},
                   {"tokens", m.tokens},
                   {"padded_tokens", m.padded_tokens},
                   {"supervised_tokens", m.supervised_tokens},
                   {"tokens_per_s", double(m.tokens) / t},
                   {"samples_per_s", double(m.samples) / t},
                   {"step_s", m.step_seconds},
                   {"mfu", mfu},
                   {"flops", m.flops},
                   {"dense_flops", m.dense_flops},
                   {"data_wait_pct", 100.0 * m.data_wait_seconds / t},
                   {"skipped", m.skipped},
                   {"skipped_total", m.skipped_total},
                   {"epoch", m.epoch},
                   {"consumed_samples", m.consumed_samples},
                   {"memory", memory}};
  if (!m.skip_ratio.empty()) {
    nlohmann::json sr = nlohmann::json::object();
    for (const auto& [layer, r] : m.skip_ratio) sr[std::to_string(layer)] = r;
    j["skip_ratio"] = sr;  // of all tokens entering the layer (α)
  }
  if (!m.skip_ratio_routable.empty()) {
    nlohmann::json sr = nlohmann::json::object();
    for (const auto& [layer, r] : m.skip_ratio_routable) sr[std::to_string(layer)] = r;
    j["skip_ratio_routable"] = sr;  // of the tokens the layer may skip (what mod.config.skip_frac sets)
  }
  if (!m.lr_groups.empty()) {
    nlohmann::json lg = nlohmann::json::object();
    for (const auto& [name, lr] : m.lr_groups) lg[name] = lr;
    j["lr_groups"] = lg;  // optimizer.groups: each group's LR this step
  }
  if (!enabled_) return j;
  write(j);
  if (tb_) tb_->scalars(m.step, j);

  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = m.step - first_step_;
  const double eta = done > 0 ? elapsed / double(done) * double(m.total_steps - m.step) : NAN;
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.3g  gnorm %.3f  %.0f tok/s  mfu %.1f%%%s",
                (long long)m.step, (long long)m.total_steps, m.loss, m.lr, m.grad_norm, double(m.tokens) / t,
                100 * mfu, m.skipped ? "  SKIPPED" : "");
  if (tty_) {
    const int width = 24;
    const int filled = m.total_steps > 0 ? int(width * double(m.step) / double(m.total_steps)) : 0;
    std::string bar(size_t(std::clamp(filled, 0, width)), '#');
    bar.resize(width, '.');
    std::cout << "\r\033[K[" << bar << "] " << line << "  ETA " << hms(eta) << std::flush;
    bar_drawn_ = true;
  } else {
    std::cout << line << "  eta " << hms(eta) << std::endl;
  }
  return j;
}

void MetricsLogger::log_eval(int64_t step, const nlohmann::json& eval) {
  if (!enabled_) return;
  write({{"step", step}, {"eval", eval}});
  if (tb_) tb_->scalars(step, eval, "eval/");
  print("eval at step " + std::to_string(step) + ": " + eval.dump());
}

void MetricsLogger::write_tensorboard(const std::string& dir, int64_t resume_step) {
  if (!enabled_) return;
  tb_ = std::make_unique<TensorBoardWriter>(dir, resume_step, [this](const std::string& w) { print(w); });
  print("metrics: TensorBoard events in " + tb_->path());
}

void MetricsLogger::print(const std::string& msg) {
  if (!enabled_) return;
  if (bar_drawn_) std::cout << "\r\033[K";
  std::cout << msg << std::endl;
  bar_drawn_ = false;
}

void MetricsLogger::finish() {
  if (bar_drawn_) std::cout << std::endl;
  bar_drawn_ = false;
}

}  // namespace gmod

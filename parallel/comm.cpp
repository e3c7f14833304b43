#include "parallel/comm.h"

#include <sstream>
#include <stdexcept>

namespace gmod {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

double Comm::all_reduce(double v, ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(device()));
  all_reduce(t, op);
  return t.item<double>();
}

namespace {

struct DoneRequest final : CommRequest {
  void wait() override {}
  bool test() override { return true; }
};

}  // namespace

std::unique_ptr<CommRequest> completed_request() { return std::make_unique<DoneRequest>(); }

void Comm::check_counts(const at::Tensor& in, const at::Tensor& out,
                        const std::vector<int64_t>& counts) const {
  int64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 0) throw std::runtime_error("parallel/comm: reduce_scatter_v: negative count");
    sum += c;
  }
  if (static_cast<int>(counts.size()) != world_size() || sum != in.numel() || out.numel() != counts[rank()] ||
      in.scalar_type() != out.scalar_type())
    throw std::runtime_error(
        "parallel/comm (" + backend() + "): reduce_scatter_v needs " + std::to_string(world_size()) +
        " counts summing to in.numel() = " + std::to_string(in.numel()) +
        ", out.numel() == counts[rank] and equal dtypes; got " + std::to_string(counts.size()) +
        " counts summing to " + std::to_string(sum) + ", out.numel() = " + std::to_string(out.numel()));
}

void Comm::reduce_scatter_v(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& counts,
                            ReduceOp op) {
  reduce_scatter_v_start(in, out, counts, op)->wait();
}

std::unique_ptr<CommRequest> Comm::all_reduce_start(at::Tensor t, ReduceOp op) {
  all_reduce(t, op);
  return completed_request();
}

std::unique_ptr<CommRequest> Comm::reduce_scatter_v_start(at::Tensor in, at::Tensor out,
                                                          std::vector<int64_t> counts, ReduceOp op) {
  check_tensor(in, "reduce_scatter_v(in)");
  check_tensor(out, "reduce_scatter_v(out)");
  check_counts(in, out, counts);
  at::Tensor all = in.clone();
  all_reduce(all, op);
  int64_t off = 0;
  for (int k = 0; k < rank(); ++k) off += counts[k];
  out.view({-1}).copy_(all.view({-1}).narrow(0, off, counts[rank()]));
  return completed_request();
}

void Comm::check_gather_counts(const at::Tensor& buf, const std::vector<int64_t>& counts) const {
  int64_t sum = 0;
  bool negative = false;
  for (int64_t c : counts) {
    negative = negative || c < 0;
    sum += c;
  }
  if (negative || static_cast<int>(counts.size()) != world_size() || sum != buf.numel())
    throw std::runtime_error(
        "parallel/comm (" + backend() + "): all_gather_v_start needs " + std::to_string(world_size()) +
        " non-negative counts summing to buf.numel() = " + std::to_string(buf.numel()) + "; got " +
        std::to_string(counts.size()) + " counts summing to " + std::to_string(sum));
}

std::unique_ptr<CommRequest> Comm::all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) {
  check_tensor(buf, "all_gather_v_start");
  check_gather_counts(buf, counts);
  at::Tensor flat = buf.view({-1});
  int64_t off = 0;
  for (int k = 0; k < world_size(); ++k) {
    if (counts[size_t(k)] > 0) {
      at::Tensor part = flat.narrow(0, off, counts[size_t(k)]);
      broadcast(part, k);
    }
    off += counts[size_t(k)];
  }
  return completed_request();
}

void Comm::count(int64_t payload_bytes, double wire_factor) {
  stats_.calls += 1;
  stats_.payload_bytes += payload_bytes;
  stats_.wire_bytes += wire_factor * static_cast<double>(payload_bytes);
}

void Comm::check_tensor(const at::Tensor& t, const char* what) const {
  if (!t.defined()) throw std::runtime_error(std::string("parallel/comm: ") + what + ": undefined tensor");
  if (!t.is_contiguous() || t.device() != device()) {
    std::ostringstream os;
    os << "parallel/comm (" << backend() << "): " << what << " needs a contiguous tensor on " << device()
       << ", got " << t.sizes() << " " << t.scalar_type() << " on " << t.device()
       << (t.is_contiguous() ? "" : " (non-contiguous)");
    throw std::runtime_error(os.str());
  }
}

}  // namespace gmod

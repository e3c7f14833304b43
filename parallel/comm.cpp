#include "parallel/comm.h"

#include <sstream>
#include <stdexcept>

namespace gmod {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

double Comm::all_reduce(double v, ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(device()));
  all_reduce(t, op);
  return t.item<double>();
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
    os << "parallel/comm (" << backend() << "): " << what << " needs a contiguous tensor on " << device() << ", got "
       << t.sizes() << " " << t.scalar_type() << " on " << t.device() << (t.is_contiguous() ? "" : " (non-contiguous)");
    throw std::runtime_error(os.str());
  }
}

}  // namespace gmod

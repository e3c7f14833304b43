#include "parallel/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <stdexcept>
#include <string>

#include "parallel/watchdog.h"

namespace gmod {
namespace {

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error("parallel/mpi_comm: " + what + " failed: " + std::string(msg, len));
}

void check_mpi(int rc, const CollectiveId& id) { check_mpi(rc, describe(id)); }

bool needs_upcast(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Datatype for reductions; only types MPI can add.
MPI_Datatype reduce_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    default:
      throw std::runtime_error(std::string("parallel/mpi_comm: cannot reduce dtype ") + c10::toString(t) +
                               " (supported: float32, float64, int32, int64, bfloat16, float16)");
  }
}

// Datatype for data movement: any element size.
MPI_Datatype move_type(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    default:
      throw std::runtime_error("parallel/mpi_comm: unsupported element size for dtype " +
                               std::string(c10::toString(t.scalar_type())));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Requests of one started collective plus what to do once they complete; holds the tensors alive until then.
class MpiRequest final : public CommRequest {
 public:
  std::vector<MPI_Request> reqs;
  std::function<void()> finish;
  CollectiveId id;
  std::vector<int> counts, displs;  // vector arguments must live until completion (MPI-3, 5.12)
  at::Tensor keep;                  // a buffer MPI reads or writes until completion

  ~MpiRequest() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    watchdog_wait_mpi(static_cast<int>(reqs.size()), reqs.data(), id);
    if (finish) finish();
    finish = nullptr;
  }
  bool test() override {
    if (done_) return true;
    int flag = 1;
    if (!reqs.empty())
      check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), id);
    return flag != 0;
  }

 private:
  bool done_ = false;
};

}  // namespace

int node_local_rank(MPI_Comm comm, int rank, const CollectiveId& wait_id) {
  MPI_Comm node;
  {
    WaitScope wait(wait_id);
    check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  }
  int local = 0;
  check_mpi(MPI_Comm_rank(node, &local), "MPI_Comm_rank(node)");
  check_mpi(MPI_Comm_free(&node), "MPI_Comm_free(node)");
  return local;
}

std::shared_ptr<Comm> MpiComm::duplicate() const {
  auto c = std::make_shared<MpiComm>(comm_);
  c->max_count_ = max_count_;
  return c;
}

std::unique_ptr<CommRequest> MpiComm::all_reduce_start(at::Tensor t, ReduceOp op) {
  check_tensor(t, "all_reduce_start");
  count(t.numel() * t.element_size(), world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
  at::Tensor f = needs_upcast(t.scalar_type()) ? t.to(at::kFloat) : t;
  if (op == ReduceOp::Avg && !at::isFloatingType(f.scalar_type()))
    throw std::runtime_error("parallel/mpi_comm: all_reduce(avg) needs a floating dtype");
  MPI_Datatype dt = reduce_type(f.scalar_type());
  auto r = std::make_unique<MpiRequest>();
  r->id = next_id("all_reduce_start (MPI_Iallreduce)");
  const int64_t n = f.numel(), es = f.element_size();
  for (int64_t off = 0; off < n; off += max_count_) {
    const int cnt = static_cast<int>(std::min(max_count_, n - off));
    r->reqs.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bytes(f) + off * es, cnt, dt, mpi_op(op), comm_, &r->reqs.back()),
              r->id);
  }
  const int world = world_;
  r->finish = [t, f, op, world]() mutable {
    if (op == ReduceOp::Avg) f.div_(world);
    if (!f.is_same(t)) t.copy_(f);
  };
  return r;
}

std::unique_ptr<CommRequest> MpiComm::reduce_scatter_v_start(at::Tensor in, at::Tensor out,
                                                             std::vector<int64_t> counts, ReduceOp op) {
  check_tensor(in, "reduce_scatter_v_start(in)");
  check_tensor(out, "reduce_scatter_v_start(out)");
  check_counts(in, out, counts);
  for (int64_t c : counts)
    if (c > max_count_)
      throw std::runtime_error("parallel/mpi_comm: reduce_scatter_v block of " + std::to_string(c) +
                               " elements exceeds the per-call limit " + std::to_string(max_count_) +
                               " (use smaller buckets)");
  count(in.numel() * in.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  at::Tensor fin = needs_upcast(in.scalar_type()) ? in.to(at::kFloat) : in;
  if (op == ReduceOp::Avg && !at::isFloatingType(fin.scalar_type()))
    throw std::runtime_error("parallel/mpi_comm: reduce_scatter(avg) needs a floating dtype");
  // Always receive into a fresh buffer: MPI forbids aliasing and `out` may be a strided-free view of
  // anything.
  at::Tensor recv = at::empty({std::max<int64_t>(1, out.numel())}, fin.options());
  std::vector<int> rc(counts.begin(), counts.end());
  auto r = std::make_unique<MpiRequest>();
  r->id = next_id("reduce_scatter_v_start (MPI_Ireduce_scatter)");
  r->reqs.emplace_back();
  check_mpi(MPI_Ireduce_scatter(fin.data_ptr(), recv.data_ptr(), rc.data(), reduce_type(fin.scalar_type()),
                                mpi_op(op), comm_, &r->reqs.back()),
            r->id);
  const int world = world_;
  r->finish = [fin, recv, out, op, world]() mutable {
    if (out.numel() == 0) return;
    at::Tensor got = recv.narrow(0, 0, out.numel());
    if (op == ReduceOp::Avg) got.div_(world);
    out.view({-1}).copy_(got);
  };
  return r;
}

std::unique_ptr<CommRequest> MpiComm::all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) {
  check_tensor(buf, "all_gather_v_start");
  check_gather_counts(buf, counts);
  if (buf.numel() > max_count_) return Comm::all_gather_v_start(buf, counts);  // (displacements are ints too)
  count(buf.numel() * buf.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  auto r = std::make_unique<MpiRequest>();
  r->id = next_id("all_gather_v_start (MPI_Iallgatherv)");
  r->keep = buf;
  int off = 0;
  for (int64_t c : counts) {
    r->counts.push_back(static_cast<int>(c));
    r->displs.push_back(off);
    off += static_cast<int>(c);
  }
  r->reqs.emplace_back();
  check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data_ptr(), r->counts.data(),
                            r->displs.data(), move_type(buf), comm_, &r->reqs.back()),
            r->id);
  return r;
}

MpiComm::MpiComm(MPI_Comm parent) : max_count_(INT_MAX) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    throw std::runtime_error("parallel/mpi_comm: MPI is not initialised (call gmod::Runtime first)");
  // Creation waits for every rank of `parent`: non-blocking and polled, or timed by the watchdog thread (no
  // non-blocking split exists), so a rank that never arrives ends the job within the deadline.
  {
    MPI_Request req;
    const CollectiveId id{"MPI_Comm_idup (creation)", 0, 0};
    check_mpi(MPI_Comm_idup(parent, &comm_, &req), id);
    watchdog_wait_mpi(1, &req, id);
  }
  // Errors come back as return codes (named by check_mpi) instead of Open MPI's default abort without
  // context.
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  id_ = next_comm_id();
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &world_), "MPI_Comm_size");
  local_rank_ = node_local_rank(comm_, rank_, CollectiveId{"MPI_Comm_split_type (creation)", id_, 0});
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::set_max_count(int64_t n) {
  if (n < 1 || n > INT_MAX) throw std::runtime_error("parallel/mpi_comm: max_count must be in [1, INT_MAX]");
  max_count_ = n;
}

void MpiComm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  count(t.numel() * t.element_size(), world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
  if (needs_upcast(t.scalar_type())) {
    at::Tensor f = t.to(at::kFloat);
    all_reduce_native(f, op);
    t.copy_(f);
  } else {
    all_reduce_native(t, op);
  }
}

void MpiComm::all_reduce_native(at::Tensor& t, ReduceOp op) {
  if (op == ReduceOp::Avg && !at::isFloatingType(t.scalar_type()))
    throw std::runtime_error("parallel/mpi_comm: all_reduce(avg) needs a floating dtype");
  MPI_Datatype dt = reduce_type(t.scalar_type());
  const CollectiveId id = next_id("all_reduce (MPI_Iallreduce)");
  const int64_t n = t.numel(), es = t.element_size();
  std::vector<MPI_Request> reqs;
  for (int64_t off = 0; off < n; off += max_count_) {
    const int cnt = static_cast<int>(std::min(max_count_, n - off));
    reqs.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bytes(t) + off * es, cnt, dt, mpi_op(op), comm_, &reqs.back()),
              id);
  }
  watchdog_wait_mpi(static_cast<int>(reqs.size()), reqs.data(), id);
  if (op == ReduceOp::Avg) t.div_(world_);
}

void MpiComm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  check_tensor(in, "reduce_scatter(in)");
  check_tensor(out, "reduce_scatter(out)");
  if (in.numel() != world_ * out.numel() || in.scalar_type() != out.scalar_type())
    throw std::runtime_error(
        "parallel/mpi_comm: reduce_scatter needs in.numel() == world * out.numel() and equal "
        "dtypes, got " +
        std::to_string(in.numel()) + " vs " + std::to_string(world_) + " * " + std::to_string(out.numel()));
  count(in.numel() * in.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  if (needs_upcast(in.scalar_type())) {
    at::Tensor fin = in.to(at::kFloat), fout = at::empty({out.numel()}, fin.options());
    reduce_scatter_native(fin, fout, op);
    out.view({-1}).copy_(fout);
    return;
  }
  // MPI forbids aliased send/recv buffers: reduce into a temporary when out overlaps in.
  const char *ib = bytes(in), *ob = bytes(out);
  const int64_t inb = in.numel() * in.element_size(), outb = out.numel() * out.element_size();
  if (ob < ib + inb && ib < ob + outb) {
    at::Tensor tmp = at::empty({out.numel()}, out.options());
    reduce_scatter_native(in, tmp, op);
    out.view({-1}).copy_(tmp);
  } else {
    at::Tensor o = out.view({-1});
    reduce_scatter_native(in, o, op);
  }
}

void MpiComm::reduce_scatter_native(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  if (op == ReduceOp::Avg && !at::isFloatingType(in.scalar_type()))
    throw std::runtime_error("parallel/mpi_comm: reduce_scatter(avg) needs a floating dtype");
  MPI_Datatype dt = reduce_type(in.scalar_type());
  const int64_t n = out.numel();
  const CollectiveId id = next_id("reduce_scatter (MPI_Ireduce_scatter_block)");
  MPI_Request req;
  if (n <= max_count_) {
    check_mpi(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(n), dt, mpi_op(op),
                                        comm_, &req),
              id);
    watchdog_wait_mpi(1, &req, id);
  } else {
    at::Tensor blocks = in.view({world_, n});
    for (int64_t off = 0; off < n; off += max_count_) {
      const int64_t len = std::min(max_count_, n - off);
      at::Tensor piece = blocks.narrow(1, off, len).contiguous();  // [world, len]
      check_mpi(MPI_Ireduce_scatter_block(piece.data_ptr(), bytes(out) + off * out.element_size(),
                                          static_cast<int>(len), dt, mpi_op(op), comm_, &req),
                id);
      watchdog_wait_mpi(1, &req, id);
    }
  }
  if (op == ReduceOp::Avg) out.div_(world_);
}

void MpiComm::all_gather(const at::Tensor& in, at::Tensor& out) {
  check_tensor(in, "all_gather(in)");
  check_tensor(out, "all_gather(out)");
  const int64_t n = in.numel(), es = in.element_size();
  if (out.numel() != world_ * n || in.scalar_type() != out.scalar_type())
    throw std::runtime_error(
        "parallel/mpi_comm: all_gather needs out.numel() == world * in.numel() and equal dtypes, "
        "got " +
        std::to_string(out.numel()) + " vs " + std::to_string(world_) + " * " + std::to_string(n));
  count(out.numel() * es, world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  MPI_Datatype dt = move_type(in);
  const bool in_place = bytes(in) == bytes(out) + rank_ * n * es;
  const CollectiveId id = next_id("all_gather (MPI_Iallgather)");
  MPI_Request req;
  if (n <= max_count_) {
    check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), static_cast<int>(n), dt, out.data_ptr(),
                             static_cast<int>(n), dt, comm_, &req),
              id);
    watchdog_wait_mpi(1, &req, id);
    return;
  }
  // Chunked: gather column ranges [off, off+len) of every block. When in place, later chunks of `in` are
  // untouched by earlier ones (each chunk only rewrites its own columns, with the same values for our block).
  at::Tensor blocks = out.view({world_, n});
  for (int64_t off = 0; off < n; off += max_count_) {
    const int64_t len = std::min(max_count_, n - off);
    at::Tensor tmp = at::empty({world_, len}, out.options());
    check_mpi(MPI_Iallgather(bytes(in) + off * es, static_cast<int>(len), dt, tmp.data_ptr(),
                             static_cast<int>(len), dt, comm_, &req),
              id);
    watchdog_wait_mpi(1, &req, id);
    blocks.narrow(1, off, len).copy_(tmp);
  }
}

void MpiComm::broadcast(at::Tensor& t, int root) {
  check_tensor(t, "broadcast");
  count(t.numel() * t.element_size(), rank_ == root ? double(world_ - 1) : 0.0);
  MPI_Datatype dt = move_type(t);
  const CollectiveId id = next_id("broadcast (MPI_Ibcast)");
  const int64_t n = t.numel(), es = t.element_size();
  std::vector<MPI_Request> reqs;
  for (int64_t off = 0; off < n; off += max_count_) {
    const int cnt = static_cast<int>(std::min(max_count_, n - off));
    reqs.emplace_back();
    check_mpi(MPI_Ibcast(bytes(t) + off * es, cnt, dt, root, comm_, &reqs.back()), id);
  }
  watchdog_wait_mpi(static_cast<int>(reqs.size()), reqs.data(), id);
}

void MpiComm::barrier() {
  const CollectiveId id = next_id("barrier (MPI_Ibarrier)");
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), id);
  watchdog_wait_mpi(1, &req, id);
}

}  // namespace gmod

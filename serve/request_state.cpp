#include "serve/request_state.h"

namespace gmod::serve {

void RequestState::append(const std::string& delta) {
  if (delta.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += delta;
  }
  cv_.notify_all();
}

void RequestState::complete(Completion c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    result_ = std::move(c);
    done_ = true;
  }
  cv_.notify_all();
}

void RequestState::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

RequestState::Update RequestState::take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_ || !pending_.empty(); });
  Update u;
  u.delta.swap(pending_);
  u.done = done_;
  if (done_) {
    u.result = result_;
    u.error = error_;
  }
  return u;
}

}  // namespace gmod::serve

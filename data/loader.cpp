// Prefetching micro-batch loader with sequence-numbered slots.
#include "data/loader.h"

#include "data/pack.h"

#include <chrono>
#include <iostream>

namespace gmod {

int64_t LoaderStats::bad() const {
  int64_t n = 0;
  for (const auto& [k, v] : bad_by_reason) n += v;
  return n;
}

DataLoader::DataLoader(const Dataset& dataset, LoaderConfig config, DataPosition start)
    : dataset_(dataset), config_(std::move(config)) {
  const int64_t G = config_.sampler.global_batch_size;
  if (config_.micro_batch_size < 1 || config_.world_size < 1 || config_.rank < 0 ||
      config_.rank >= config_.world_size || config_.prefetch < 1 || config_.num_workers < 0)
    throw std::invalid_argument(
        "DataLoader: need micro_batch_size >= 1, 0 <= rank < world_size, prefetch >= 1, "
        "num_workers >= 0");
  step_samples_ = static_cast<int64_t>(config_.world_size) * config_.micro_batch_size;
  if (G < 1 || G % step_samples_ != 0)
    throw std::invalid_argument(
        "DataLoader: global batch size " + std::to_string(G) +
        " must be a positive multiple of world_size * micro_batch_size = " + std::to_string(step_samples_));
  const int64_t N = static_cast<int64_t>(dataset_.size());
  steps_per_epoch_ = (N / G) * G / step_samples_;
  if (steps_per_epoch_ == 0)
    throw std::invalid_argument("DataLoader: " + dataset_.config().data_path + " has " + std::to_string(N) +
                                " records, fewer than one global batch of " + std::to_string(G));
  if (start.consumed_samples % step_samples_ != 0 ||
      start.consumed_samples / step_samples_ > steps_per_epoch_)
    throw std::invalid_argument(
        "DataLoader: resume position consumed_samples=" + std::to_string(start.consumed_samples) +
        " is not a micro-step boundary (multiple of " + std::to_string(step_samples_) + ") within the epoch");
  first_step_ = start.epoch * steps_per_epoch_ + start.consumed_samples / step_samples_;
  if (config_.sampler.group_by_modality_length) lengths_ = dataset_.modality_lengths();
  for (int i = 0; i < config_.num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

std::shared_ptr<const std::vector<size_t>> DataLoader::order_for(int64_t epoch) {
  std::lock_guard<std::mutex> lk(order_mu_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  auto order = std::make_shared<const std::vector<size_t>>(
      epoch_order(dataset_.size(), config_.sampler, epoch, lengths_));
  while (orders_.size() >= 2) orders_.erase(orders_.begin());  // at most the current and the next epoch
  orders_[epoch] = order;
  return order;
}

Batch DataLoader::build(int64_t seq) {
  const int64_t step = first_step_ + seq;
  const int64_t epoch = step / steps_per_epoch_;
  const int64_t m = step % steps_per_epoch_;
  auto order = order_for(epoch);
  const size_t begin =
      static_cast<size_t>(m * step_samples_ + int64_t{config_.rank} * config_.micro_batch_size);
  std::vector<PreparedSample> samples;
  std::vector<BadRecord> bad;
  for (size_t k = begin; k < begin + static_cast<size_t>(config_.micro_batch_size); ++k) {
    PreparedSample s;
    BadRecord b;
    if (dataset_.try_prepare((*order)[k], s, b)) {
      samples.push_back(std::move(s));
    } else {
      bad.push_back(std::move(b));
    }
  }
  Batch batch = config_.pack_to > 0
                    ? collate_packed(samples, dataset_.encoder().pad_id(), dataset_.config().image.crop, config_.pack_to)
                    : collate(samples, dataset_.encoder().pad_id(), dataset_.config().image.crop);
  if (config_.pin_memory)
    for (at::Tensor* t : {&batch.input_ids, &batch.labels, &batch.attention_mask, &batch.token_roles,
                          &batch.pixel_values, &batch.positions, &batch.pixel_values_videos})
      if (t->defined() && !t->is_pinned()) *t = t->pin_memory();
  batch.skipped = std::move(bad);
  batch.sequence = seq;
  return batch;
}

void DataLoader::worker_loop() {
  for (;;) {
    int64_t seq;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || next_produce_ < next_consume_ + config_.prefetch; });
      if (stop_) return;
      seq = next_produce_++;
    }
    Batch b;
    std::exception_ptr err;
    try {
      b = build(seq);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err) {
        errors_[seq] = err;
      } else {
        ready_[seq] = std::move(b);
      }
    }
    cv_ready_.notify_all();
  }
}

Batch DataLoader::next() {
  Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  if (workers_.empty()) {
    b = build(next_consume_);
    std::lock_guard<std::mutex> lk(mu_);
    ++next_consume_;
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t seq = next_consume_;
    cv_ready_.wait(lk, [&] { return ready_.count(seq) || errors_.count(seq); });
    if (auto e = errors_.find(seq); e != errors_.end()) std::rethrow_exception(e->second);
    b = std::move(ready_[seq]);
    ready_.erase(seq);
    ++next_consume_;
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  cv_work_.notify_all();

  // Statistics in sequence order, so they (and the stop decision) do not depend on worker timing.
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.batches;
  stats_.samples += b.size();
  stats_.seen += b.size() + static_cast<int64_t>(b.skipped.size());
  stats_.tokens += b.tokens;
  stats_.truncated += b.truncated;
  for (const auto& bad : b.skipped) {
    ++stats_.bad_by_reason[bad.reason];
    if (config_.log_bad_records && logged_.insert(bad.index).second)
      std::cerr << "[data rank " << config_.rank << "] skipped (" << bad.reason << "): " << bad.message
                << "\n";
  }
  const int64_t n_bad = stats_.bad();
  if (config_.max_bad_records >= 0 && n_bad > config_.max_bad_records)
    throw std::runtime_error(dataset_.config().data_path + ": " + std::to_string(n_bad) +
                             " bad records skipped on rank " + std::to_string(config_.rank) +
                             ", more than max_bad_records=" + std::to_string(config_.max_bad_records) +
                             " (run `gmod data check` for the full list)" +
                             (b.skipped.empty() ? "" : "; last: " + b.skipped.back().message));
  if (stats_.seen >= config_.bad_fraction_min_seen && n_bad > config_.max_bad_fraction * stats_.seen)
    throw std::runtime_error(dataset_.config().data_path + ": " + std::to_string(n_bad) + " of " +
                             std::to_string(stats_.seen) + " records were bad on rank " +
                             std::to_string(config_.rank) +
                             ", more than max_bad_fraction=" + std::to_string(config_.max_bad_fraction) +
                             " (run `gmod data check` for the full list)");
  return b;
}

DataPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t step = first_step_ + next_consume_;
  return {step / steps_per_epoch_, (step % steps_per_epoch_) * step_samples_};
}

double DataLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wait_s_;
}

LoaderStats DataLoader::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace gmod

#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace sf {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = fn_;
    int64_t begin = idx * chunk_, end = std::min(n_, begin + chunk_);
    lk.unlock();
    if (begin < end) (*fn)(begin, end);
    lk.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int64_t parts = std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  int64_t chunk = (n + size() - 1) / size();
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
}

ThreadPool& cpu_pool() {
  static ThreadPool pool([] {
    if (const char* s = std::getenv("SF_THREADS")) return std::max(1, std::atoi(s));
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

}  // namespace sf

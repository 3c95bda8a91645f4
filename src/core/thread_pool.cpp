#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/env.h"

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
    const bool pieces = pieces_;
    const int64_t n = n_, chunk = chunk_;
    int64_t begin = idx * chunk, end = std::min(n, begin + chunk);
    lk.unlock();
    if (pieces) {
      for (int64_t i; (i = next_.fetch_add(chunk)) < n;) (*fn)(i, std::min(n, i + chunk));
    } else if (begin < end) {
      (*fn)(begin, end);
    }
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
    pieces_ = false;
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
}

void ThreadPool::parallel_pieces(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t piece) {
  if (n <= 0) return;
  piece = std::max<int64_t>(1, piece);
  if (n <= piece || workers_.empty()) {
    for (int64_t i = 0; i < n; i += piece) fn(i, std::min(n, i + piece));
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = piece;
    pieces_ = true;
    next_.store(0);
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  for (int64_t i; (i = next_.fetch_add(piece)) < n;) fn(i, std::min(n, i + piece));
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
}

int usable_cpus() {
  if (const long long env = env_int(Env::Threads, 0); env > 0) return int(std::min<long long>(env, 1 << 16));
  int n = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = std::min(n, CPU_COUNT(&set));
  std::ifstream f("/sys/fs/cgroup/cpu.max");  // cgroup v2: "QUOTA PERIOD" or "max PERIOD"
  std::string quota;
  long long period = 0;
  if (f >> quota >> period && quota != "max" && period > 0) {
    const long long q = std::atoll(quota.c_str());
    if (q > 0) n = std::min<long long>(n, std::max<long long>(1, (q + period - 1) / period));
  }
  return std::max(1, n);
}

ThreadPool& cpu_pool() {
  static ThreadPool pool(usable_cpus());
  return pool;
}

void zero_parallel(void* p, size_t bytes) {
  constexpr int64_t kPiece = int64_t(64) << 20;
  char* c = static_cast<char*>(p);
  cpu_pool().parallel_pieces(
      int64_t(bytes), [c](int64_t b0, int64_t b1) { std::memset(c + b0, 0, size_t(b1 - b0)); }, kPiece);
}

}  // namespace sf

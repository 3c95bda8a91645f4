// A fixed pool of worker threads for data-parallel loops (parallel_for) on the CPU.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sf {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 1: everything runs on the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end) over [0, n) split into at most size() contiguous chunks; blocks until done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);
  // Calls fn over [0, n) in pieces of `piece` elements (the last shorter), handed out one at a
  // time to whichever thread is free: a thread that shares its core (with the CUDA driver's or a
  // spinning thread) does less, instead of every thread waiting for its one equal chunk. The
  // pieces' bounds depend only on n and piece.
  void parallel_pieces(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t piece);

 private:
  void worker(int idx);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0;
  bool pieces_ = false;  // parallel_pieces: chunk_ is the piece, next_ the next one
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Threads worth running: SF_THREADS if set, else the CPUs of the process's affinity mask, capped
// by a cgroup v2 CPU quota (hardware_concurrency() counts the host's CPUs, also in a container
// limited to fewer: threads beyond those only contend and start with cold caches).
int usable_cpus();
// The process's compute pool for CPU kernels (usable_cpus() threads).
ThreadPool& cpu_pool();
// memset(p, 0, bytes) by the pool's threads in 64 MiB pieces. Zeroing fresh host memory is its
// first touch: the page faults (the kernel clearing each page) run on every core instead of one
// (set-up of tens of GB of masters and AdamW state).
void zero_parallel(void* p, size_t bytes);

}  // namespace sf

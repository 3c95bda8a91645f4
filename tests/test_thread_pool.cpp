// The CPU compute pool: static chunks and dynamic pieces cover every index exactly once, and the
// pieces' bounds depend only on n and the piece size (the AdamW pass relies on neither).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

namespace sf {
namespace {

TEST(ThreadPool, EveryIndexOnceStaticAndPieces) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000), int64_t(100003)}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "static, n " << n;
      for (int64_t piece : {int64_t(1), int64_t(64), int64_t(999)}) {
        std::vector<std::atomic<int>> h(static_cast<size_t>(n));
        std::mutex mu;
        std::set<std::pair<int64_t, int64_t>> ranges;
        pool.parallel_pieces(
            n,
            [&](int64_t a, int64_t b) {
              for (int64_t i = a; i < b; ++i) h[size_t(i)]++;
              std::lock_guard<std::mutex> lk(mu);
              ranges.insert({a, b});
            },
            piece);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[size_t(i)].load(), 1) << "pieces, n " << n << " piece " << piece;
        for (const auto& r : ranges) {
          EXPECT_EQ(r.first % piece, 0);
          EXPECT_EQ(r.second, std::min(n, r.first + piece));
        }
        EXPECT_EQ(int64_t(ranges.size()), (n + piece - 1) / piece);
      }
    }
  }
}

// A slow thread does not hold the others back: with one piece per call sleeping, the rest of the
// pieces are taken by the other threads (every thread that took part did some).
TEST(ThreadPool, PiecesGoToFreeThreads) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> slow{0};
  pool.parallel_pieces(
      400,
      [&](int64_t a, int64_t) {
        if (a == 0) {
          slow++;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        std::lock_guard<std::mutex> lk(mu);
        ids.insert(std::this_thread::get_id());
      },
      1);
  EXPECT_EQ(slow.load(), 1);
  EXPECT_GE(ids.size(), 2u);
}

}  // namespace
}  // namespace sf

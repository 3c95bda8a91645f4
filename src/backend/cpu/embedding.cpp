// Token embedding: gather rows of the table; backward scatters gradient rows back.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {

// Id values (the front, ops_check.h, checked ids is I32 [N]), on the caller thread: a throw inside
// a pool task would terminate the process.
void check_ids(const char* op, const Tensor& ids, int64_t N, int64_t V) {
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) {
    SF_CHECK(id[n] >= 0 && id[n] < V, std::string(op) + ": token id " + std::to_string(id[n]) + " at position " +
                                          std::to_string(n) + " is outside the vocabulary [0, " + std::to_string(V) +
                                          ")");
  }
}

}  // namespace

void ids_or_zero(Tensor out, Tensor ids, int64_t limit) {
  const int32_t* id = ids.ptr<int32_t>();
  int32_t* o = out.ptr<int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n) o[n] = id[n] >= 0 && id[n] < limit ? id[n] : 0;
}

void embedding_forward(Tensor out, Tensor ids, Tensor table) {
  const int64_t V = table.rows(), H = table.cols(), N = out.rows();  // table [V, H], out [N, H], ids [N]
  check_ids("embedding_forward", ids, N, V);
  const int32_t* id = ids.ptr<int32_t>();
  cpu_pool().parallel_for(
      N,
      [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          if (out.dtype == table.dtype) {
            std::memcpy(static_cast<char*>(out.data) + n * H * dtype_size(out.dtype),
                        static_cast<const char*>(table.data) + id[n] * H * dtype_size(table.dtype),
                        size_t(H) * dtype_size(out.dtype));
          } else {
            for (int64_t c = 0; c < H; ++c) set(out, n * H + c, get(table, id[n] * H + c));
          }
        }
      },
      std::max<int64_t>(1, 8192 / std::max<int64_t>(1, H)));
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) {
  const int64_t V = dtable.rows(), H = dtable.cols(), N = dout.rows();  // dtable [V, H], dout [N, H], ids [N]
  check_ids("embedding_backward", ids, N, V);
  const int32_t* id = ids.ptr<int32_t>();
  // Positions grouped by id (stable: positions in order). Each id's rows are summed in fp64 by
  // one thread and added once: no races, one bf16 rounding, same bits for any thread count.
  std::vector<int64_t> order(static_cast<size_t>(N));  // [N] positions sorted by id
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  std::vector<int64_t> seg;  // [n_unique + 1] start of each id's run in `order`
  for (int64_t i = 0; i < N; ++i) {
    if (i == 0 || id[order[size_t(i)]] != id[order[size_t(i - 1)]]) seg.push_back(i);
  }
  seg.push_back(N);
  const int64_t nseg = int64_t(seg.size()) - 1;
  cpu_pool().parallel_for(
      nseg,
      [&](int64_t s0, int64_t s1) {
        std::vector<double> acc(static_cast<size_t>(H));  // [H]
        for (int64_t s = s0; s < s1; ++s) {
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t i = seg[size_t(s)]; i < seg[size_t(s + 1)]; ++i) {
            const int64_t n = order[size_t(i)];
            for (int64_t c = 0; c < H; ++c) acc[size_t(c)] += get(dout, n * H + c);
          }
          const int64_t row = id[order[size_t(seg[size_t(s)])]];
          for (int64_t c = 0; c < H; ++c) {
            set(dtable, row * H + c, float(double(get(dtable, row * H + c)) + acc[size_t(c)]));
          }
        }
      },
      std::max<int64_t>(1, 8192 / std::max<int64_t>(1, H)));
}

}  // namespace sf::cpu

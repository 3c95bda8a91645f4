// Causal GQA attention, the reference: exact two-pass softmax per query row in fp64, and a
// FlashAttention-style backward from the saved log-sum-exp. Memory per thread is O(T * hd);
// no T x T matrix exists. Packed rows (d.pos): query t sees keys lo(t) = t - pos[t] .. t, so a
// record's rows get the same sums, in the same order, as the record alone in its own row.
// Sliding window (d.window = W > 0): the first key is also at least t - W + 1.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {

// First key visible to query t of sequence b: t - pos[t] (packed rows), else 0; with a window W,
// at least t - W + 1.
inline int seg_lo(const int32_t* pos, int window, int b, int T, int t) {
  const int lo = pos ? t - pos[int64_t(b) * T + t] : 0;
  return window > 0 ? std::max(lo, t - window + 1) : lo;
}

// dst [T, hd] = the head_dim columns of head `head` of sequence b of x [B*T, n*hd], as fp32.
void load_head(const Tensor& x, int b, int T, int head, int hd, float* dst) {
  const int64_t width = x.cols();
  for (int t = 0; t < T; ++t) load(x, (int64_t(b) * T + t) * width + int64_t(head) * hd, hd, dst + int64_t(t) * hd);
}

// Scaled scores of query row q [hd] against keys lo..t of K [T, hd], into s[lo..t]; returns the max.
double scores(const float* q, const float* K, int lo, int t, int hd, double scale, double* s) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int j = lo; j <= t; ++j) {
    const float* kj = K + int64_t(j) * hd;
    double dot = 0.0;
    for (int e = 0; e < hd; ++e) dot += double(q[e]) * double(kj[e]);
    s[j] = scale * dot;
    mx = std::max(mx, s[j]);
  }
  return mx;
}

}  // namespace

size_t attention_workspace_bytes(const AttnDims&) { return 0; }

void check_positions(const AttnDims& d) {
  if (d.pos.empty()) return;
  const int64_t N = int64_t(d.B) * d.T;
  const int32_t* p = d.pos.ptr<int32_t>();  // [B*T]
  for (int64_t i = 0; i < N; ++i) {
    const int64_t t = i % d.T;
    SF_CHECK(p[i] == 0 || (t > 0 && p[i] == p[i - 1] + 1),
             "attention: pos[" + std::to_string(i) + "] = " + std::to_string(p[i]) +
                 " neither starts a record (0) nor continues one (previous + 1)");
  }
}

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d) {
  check_positions(d);
  const int T = d.T, hd = d.head_dim, group = d.n_head / d.n_kv_head;
  const double scale = d.scale;
  const size_t nT = size_t(T), nhd = size_t(hd);
  float* lsep = lse.ptr<float>();                                       // [B, n_head, T]
  const int32_t* pos = d.pos.empty() ? nullptr : d.pos.ptr<int32_t>();  // [B*T] or null
  // One task per (b, h); K/V of the task's kv head are converted once per run of equal (b, g).
  cpu_pool().parallel_for(int64_t(d.B) * d.n_head, [&](int64_t i0, int64_t i1) {
    std::vector<float> K(nT * nhd), V(nT * nhd);  // [T, hd] of kv head (b, g)
    std::vector<float> qrow(nhd), orow(nhd);      // [hd]
    std::vector<double> s(nT), acc(nhd);          // [T] scores, [hd] output sum
    int64_t loaded = -1;
    for (int64_t i = i0; i < i1; ++i) {
      const int b = int(i / d.n_head), h = int(i % d.n_head), g = h / group;
      if (loaded != int64_t(b) * d.n_kv_head + g) {
        load_head(k, b, T, g, hd, K.data());
        load_head(v, b, T, g, hd, V.data());
        loaded = int64_t(b) * d.n_kv_head + g;
      }
      for (int t = 0; t < T; ++t) {
        const int64_t row = (int64_t(b) * T + t) * q.cols() + int64_t(h) * hd;
        load(q, row, hd, qrow.data());
        const int lo = seg_lo(pos, d.window, b, T, t);
        const double mx = scores(qrow.data(), K.data(), lo, t, hd, scale, s.data());
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = lo; j <= t; ++j) {
          const double p = std::exp(s[size_t(j)] - mx);
          sum += p;
          const float* vj = V.data() + int64_t(j) * hd;
          for (int e = 0; e < hd; ++e) acc[size_t(e)] += p * vj[e];
        }
        for (int e = 0; e < hd; ++e) orow[size_t(e)] = float(acc[size_t(e)] / sum);
        store(out, row, hd, orow.data());
        lsep[(int64_t(b) * d.n_head + h) * T + t] = float(mx + std::log(sum));
      }
    }
  });
}

// With p_j = exp(s_j - lse), s_j = scale q.k_j, D = dO.O:
//   dv_j += p_j dO;  dp_j = dO.v_j;  ds_j = p_j (dp_j - D);  dq += scale ds_j k_j;  dk_j += scale ds_j q.
// Tasks are (b, kv head) groups: the dk/dv rows of a group are summed over its q heads by one
// thread, in head order, so no races and the same bits for any thread count.
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttnDims& d, Tensor ws) {
  check_positions(d);
  const int T = d.T, hd = d.head_dim, group = d.n_head / d.n_kv_head;
  const double scale = d.scale;
  const size_t nT = size_t(T), nhd = size_t(hd);
  const float* lsep = lse.ptr<float>();                                 // [B, n_head, T]
  const int32_t* pos = d.pos.empty() ? nullptr : d.pos.ptr<int32_t>();  // [B*T] or null
  cpu_pool().parallel_for(int64_t(d.B) * d.n_kv_head, [&](int64_t i0, int64_t i1) {
    std::vector<float> K(nT * nhd), V(nT * nhd);                    // [T, hd]
    std::vector<double> dK(nT * nhd), dV(nT * nhd);                 // [T, hd] fp64 sums
    std::vector<float> qrow(nhd), orow(nhd), dorow(nhd), row(nhd);  // [hd]
    std::vector<double> s(nT), dqacc(nhd);                          // [T], [hd]
    for (int64_t i = i0; i < i1; ++i) {
      const int b = int(i / d.n_kv_head), g = int(i % d.n_kv_head);
      load_head(k, b, T, g, hd, K.data());
      load_head(v, b, T, g, hd, V.data());
      std::fill(dK.begin(), dK.end(), 0.0);
      std::fill(dV.begin(), dV.end(), 0.0);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int t = 0; t < T; ++t) {
          const int64_t qoff = (int64_t(b) * T + t) * q.cols() + int64_t(h) * hd;
          load(q, qoff, hd, qrow.data());
          load(out, qoff, hd, orow.data());
          load(dout, qoff, hd, dorow.data());
          double D = 0.0;
          for (int e = 0; e < hd; ++e) D += double(dorow[size_t(e)]) * orow[size_t(e)];
          const double L = lsep[(int64_t(b) * d.n_head + h) * T + t];
          const int lo = seg_lo(pos, d.window, b, T, t);
          scores(qrow.data(), K.data(), lo, t, hd, scale, s.data());
          std::fill(dqacc.begin(), dqacc.end(), 0.0);
          for (int j = lo; j <= t; ++j) {
            const double p = std::exp(s[size_t(j)] - L);
            const float* kj = K.data() + int64_t(j) * hd;
            const float* vj = V.data() + int64_t(j) * hd;
            double* dkj = dK.data() + int64_t(j) * hd;
            double* dvj = dV.data() + int64_t(j) * hd;
            double dp = 0.0;
            for (int e = 0; e < hd; ++e) {
              dp += double(dorow[size_t(e)]) * vj[e];
              dvj[e] += p * dorow[size_t(e)];
            }
            const double ds = scale * p * (dp - D);
            for (int e = 0; e < hd; ++e) {
              dqacc[size_t(e)] += ds * kj[e];
              dkj[e] += ds * qrow[size_t(e)];
            }
          }
          for (int e = 0; e < hd; ++e) row[size_t(e)] = float(dqacc[size_t(e)]);
          store(dq, qoff, hd, row.data());
        }
      }
      for (int t = 0; t < T; ++t) {
        const int64_t koff = (int64_t(b) * T + t) * k.cols() + int64_t(g) * hd;
        for (int e = 0; e < hd; ++e) row[size_t(e)] = float(dK[size_t(int64_t(t) * hd + e)]);
        store(dk, koff, hd, row.data());
        for (int e = 0; e < hd; ++e) row[size_t(e)] = float(dV[size_t(int64_t(t) * hd + e)]);
        store(dv, koff, hd, row.data());
      }
    }
  });
}

}  // namespace sf::cpu

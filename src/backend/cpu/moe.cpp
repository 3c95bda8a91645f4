// Mixture-of-experts kernels (ops.h): router softmax + top-k, the counting sort of token slots by
// expert, gather / combine of rows, grouped GEMMs over the sorted rows and the load-balancing
// loss. Every output element is computed by one thread in a fixed order (cpu_common.h).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {

// Rows of a [R, C] tensor per pool task: about 2^14 elements.
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(C, 1)); }

// f(r, typed data of ts...) for every row r of [0, R), rows C elements wide, in pool tasks.
template <class F, class... Ts>
void for_rows(int64_t R, int64_t C, F&& f, const Ts&... ts) {
  visit_all(
      [&](auto*... ps) {
        cpu_pool().parallel_for(
            R,
            [&](int64_t r0, int64_t r1) {
              for (int64_t r = r0; r < r1; ++r) f(r, ps...);
            },
            row_grain(C));
      },
      ts...);
}

}  // namespace

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm) {
  const int64_t N = idx.rows(), k = idx.cols(), E = logits.cols();  // logits, probs [N,E]; idx, weights [N,k]
  float* P = probs.ptr<float>();
  int32_t* I = idx.ptr<int32_t>();
  float* W = weights.ptr<float>();
  cpu_pool().parallel_for(
      N,
      [&](int64_t r0, int64_t r1) {
        std::vector<char> taken(static_cast<size_t>(E));
        for (int64_t r = r0; r < r1; ++r) {
          float* p = P + r * E;
          float mx = -INFINITY;
          for (int64_t e = 0; e < E; ++e) mx = std::max(mx, get(logits, r * E + e));
          double sum = 0;
          for (int64_t e = 0; e < E; ++e) {
            p[e] = std::exp(get(logits, r * E + e) - mx);
            sum += p[e];
          }
          const float inv = float(1.0 / sum);
          for (int64_t e = 0; e < E; ++e) p[e] *= inv;
          // Top-k by repeated selection; strict > keeps the lower expert on ties, and starting
          // from the first free expert keeps every index valid even when probs are NaN.
          std::fill(taken.begin(), taken.end(), 0);
          double wsum = 0;
          for (int64_t j = 0; j < k; ++j) {
            int64_t best = 0;
            while (taken[size_t(best)]) ++best;
            for (int64_t e = best + 1; e < E; ++e)
              if (!taken[size_t(e)] && p[e] > p[best]) best = e;
            taken[size_t(best)] = 1;
            I[r * k + j] = int32_t(best);
            W[r * k + j] = p[best];
            wsum += p[best];
          }
          if (renorm) {
            const float s = float(wsum);
            for (int64_t j = 0; j < k; ++j) W[r * k + j] /= s;
          }
        }
      },
      row_grain(E));
  if (stats.empty()) return;
  float* st = stats.ptr<float>();  // [2, E]: counts, prob sums
  cpu_pool().parallel_for(E, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      int64_t count = 0;
      double psum = 0;
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t j = 0; j < k; ++j) count += I[r * k + j] == e;
        psum += P[r * E + e];
      }
      st[e] += float(count);
      st[E + e] += float(psum);
    }
  });
}

void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                        float aux_scale) {
  const int64_t N = idx.rows(), k = idx.cols(), E = probs.cols();
  const float* P = probs.ptr<float>();
  const int32_t* I = idx.ptr<int32_t>();
  const float* dW = dweights.ptr<float>();
  const float* C = counts.empty() ? nullptr : counts.ptr<float>();
  cpu_pool().parallel_for(
      N,
      [&](int64_t r0, int64_t r1) {
        std::vector<double> dp(static_cast<size_t>(E));
        for (int64_t r = r0; r < r1; ++r) {
          const float* p = P + r * E;
          for (int64_t e = 0; e < E; ++e) dp[size_t(e)] = C ? double(aux_scale) * C[e] : 0.0;
          const int32_t* ir = I + r * k;
          const float* dw = dW + r * k;
          if (renorm) {  // w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S
            double S = 0, dot = 0;
            for (int64_t j = 0; j < k; ++j) S += p[ir[j]];
            for (int64_t j = 0; j < k; ++j) dot += double(dw[j]) * (p[ir[j]] / S);
            for (int64_t j = 0; j < k; ++j) dp[size_t(ir[j])] += (dw[j] - dot) / S;
          } else {
            for (int64_t j = 0; j < k; ++j) dp[size_t(ir[j])] += dw[j];
          }
          double pdp = 0;  // softmax: dlogit_e = p_e (dp_e - sum p dp)
          for (int64_t e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
          for (int64_t e = 0; e < E; ++e) set(dlogits, r * E + e, float(p[e] * (dp[size_t(e)] - pdp)));
        }
      },
      row_grain(E));
}

void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx) {
  const int64_t S = idx.numel(), E = offsets.numel() - 1;
  const int32_t* I = idx.ptr<int32_t>();
  int32_t* off = offsets.ptr<int32_t>();
  std::vector<int64_t> next(size_t(E) + 1, 0);
  for (int64_t s = 0; s < S; ++s) {
    SF_CHECK(I[s] >= 0 && I[s] < E,
             "moe_permute: expert index " + std::to_string(I[s]) + " out of [0, " + std::to_string(E) + ")");
    ++next[size_t(I[s]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) next[size_t(e) + 1] += next[size_t(e)];
  for (int64_t e = 0; e <= E; ++e) off[e] = int32_t(next[size_t(e)]);
  int32_t* ss = sorted_slot.ptr<int32_t>();
  int32_t* sp = slot_pos.ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {  // slots in order: stable within an expert
    const int64_t p = next[size_t(I[s])]++;
    ss[p] = int32_t(s);
    sp[s] = int32_t(p);
  }
}

void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k) {
  const int64_t H = xs.cols();
  const int32_t* ss = sorted_slot.ptr<int32_t>();
  for_rows(
      xs.rows(), H,
      [&](int64_t p, auto* o, auto* in) {
        const int64_t n = ss[p] / k;
        for (int64_t h = 0; h < H; ++h) st(o, p * H + h, ld(in, n * H + h));
      },
      xs, x);
}

void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k) {
  const int64_t H = dx.cols();
  const int32_t* sp = slot_pos.ptr<int32_t>();
  for_rows(
      dx.rows(), H * k,
      [&](int64_t n, auto* o, auto* in) {
        for (int64_t h = 0; h < H; ++h) {
          float acc = 0.f;
          for (int64_t j = 0; j < k; ++j) acc += ld(in, int64_t(sp[n * k + j]) * H + h);
          st(o, n * H + h, acc);
        }
      },
      dx, dxs);
}

void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta) {
  const int64_t M = out.rows(), Nout = out.cols(), K = a.cols(), E = w.rows(), stride = w.cols();
  const int32_t* off = offsets.ptr<int32_t>();
  SF_CHECK(off[0] == 0 && off[E] <= M, "moe_grouped_matmul: offsets do not cover the rows of a");
  const float* af = as_f32(a, 0);  // [M, K]
  const float* wf = as_f32(w, 1);  // [E, stride]
  float* of = out.dtype == DType::F32 ? out.ptr<float>() : scratch(2, size_t(M * Nout));
  if (out.dtype != DType::F32 && beta != 0.f) load(out, 0, M * Nout, of);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], r1 = off[e + 1];
    SF_CHECK(r0 <= r1, "moe_grouped_matmul: offsets decrease at expert " + std::to_string(e));
    // W_e: [Nout, K] (trans_w) or [K, Nout], row-major inside row e of w.
    sgemm(false, trans_w, r1 - r0, Nout, K, 1.f, af + r0 * K, K, wf + e * stride, trans_w ? K : Nout, beta,
          of + r0 * Nout, Nout);
  }
  if (out.dtype != DType::F32) store(out, 0, M * Nout, of);
}

void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets) {
  const int64_t M = dy.rows(), Nout = dy.cols(), K = x.cols(), E = dw.rows(), stride = dw.cols();
  const int32_t* off = offsets.ptr<int32_t>();
  SF_CHECK(off[0] == 0 && off[E] <= M, "moe_grouped_matmul_wgrad: offsets do not cover the rows of dy");
  const float* dyf = as_f32(dy, 0);  // [M, Nout]
  const float* xf = as_f32(x, 1);    // [M, K]
  float* wf = dw.dtype == DType::F32 ? dw.ptr<float>() : scratch(2, size_t(E * stride));
  if (dw.dtype != DType::F32) load(dw, 0, E * stride, wf);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], r1 = off[e + 1];
    SF_CHECK(r0 <= r1, "moe_grouped_matmul_wgrad: offsets decrease at expert " + std::to_string(e));
    if (r1 == r0) continue;
    sgemm(true, false, Nout, K, r1 - r0, 1.f, dyf + r0 * Nout, Nout, xf + r0 * K, K, 1.f, wf + e * stride, K);
  }
  if (dw.dtype != DType::F32) store(dw, 0, E * stride, wf);
}

void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos) {
  const int64_t H = y.cols(), k = weights.cols();
  const float* W = weights.ptr<float>();
  const int32_t* sp = slot_pos.ptr<int32_t>();
  for_rows(
      y.rows(), H * k,
      [&](int64_t n, auto* o, auto* in) {
        for (int64_t h = 0; h < H; ++h) {
          float acc = 0.f;
          for (int64_t j = 0; j < k; ++j) acc += W[n * k + j] * ld(in, int64_t(sp[n * k + j]) * H + h);
          st(o, n * H + h, acc);
        }
      },
      y, ys);
}

void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos) {
  const int64_t H = dy.cols(), k = weights.cols();
  const float* W = weights.ptr<float>();
  float* dW = dweights.ptr<float>();
  const int32_t* sp = slot_pos.ptr<int32_t>();
  for_rows(
      dy.rows(), H * k,
      [&](int64_t n, auto* dyo, auto* g, auto* y) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t p = sp[n * k + j];
          const float wj = W[n * k + j];
          double dot = 0;
          for (int64_t h = 0; h < H; ++h) {
            const float gv = ld(g, n * H + h);
            st(dyo, p * H + h, wj * gv);
            dot += double(gv) * ld(y, p * H + h);
          }
          dW[n * k + j] = float(dot);
        }
      },
      dys, dy, ys);
}

// Gemma 4's per-expert scale of the routing weights (a few N*k values: one serial pass).
void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale) {
  const int64_t S = w.numel();  // out, w, idx [N, k]; scale [E]
  const float* W = w.ptr<float>();
  float* O = out.ptr<float>();
  const int32_t* ix = idx.ptr<int32_t>();
  visit(scale, [&](auto* sc) {
    for (int64_t i = 0; i < S; ++i) O[i] = W[i] * ld(sc, ix[i]);
  });
}

void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale) {
  const int64_t S = w.numel(), E = scale.numel();  // dw, dout, w, idx [N, k]; scale, dscale [E]
  const float* W = w.ptr<float>();
  const float* G = dout.ptr<float>();
  float* D = dw.ptr<float>();
  const int32_t* ix = idx.ptr<int32_t>();
  // [E], the slots in order: deterministic. dout is read here, before dw (which may alias it) is written.
  std::vector<double> acc(size_t(E), 0.0);
  for (int64_t i = 0; i < S; ++i) acc[size_t(ix[i])] += double(G[i]) * W[i];
  visit(dscale, [&](auto* ds) {
    for (int64_t e = 0; e < E; ++e) st(ds, e, float(double(ld(ds, e)) + acc[size_t(e)]));
  });
  visit(scale, [&](auto* sc) {
    for (int64_t i = 0; i < S; ++i) D[i] = G[i] * ld(sc, ix[i]);
  });
}

void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale) {
  const int64_t E = stats.numel() / 2;
  const float* s = stats.ptr<float>();
  double acc = 0;
  for (int64_t e = 0; e < E; ++e) acc += double(s[e]) * s[E + e];
  loss_sum.ptr<float>()[0] += float(double(scale) * acc);
}

}  // namespace sf::cpu

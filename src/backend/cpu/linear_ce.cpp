// Fused LM head + cross-entropy, chunked over tokens so that only [chunk, V] logits exist.
// Per chunk: logits = x_c @ w^T; per row lse, loss = lse - logit[label], and in place the
// gradient g = grad_scale * (softmax - onehot); then dw += g^T @ x_c and dx_c = g @ w. With a soft-cap
// c the row's logits become s = c tanh(z / c) first and g is multiplied by ds/dz = 1 - (s / c)^2.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {

constexpr int32_t kIgnore = -100;
// fp32 elements of one chunk's buffers (logits [c, V] + x/dx staging [c, H]): 16 MiB.
constexpr int64_t kChunkBudget = int64_t(1) << 22;

int64_t chunk_rows(int64_t N, int64_t H, int64_t V) {
  return std::min(N, std::max<int64_t>(1, kChunkBudget / std::max<int64_t>(1, V + H)));
}

}  // namespace

size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) {
  return size_t(chunk_rows(N, H, V) * (V + H)) * sizeof(float);
}

void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float grad_scale,
                          Tensor ws, float softcap) {
  // Shapes, dtypes, aliasing and the workspace size: ops_check.h. dx may be x itself: dx rows of a
  // chunk are written after that chunk's x rows were last read.
  const int64_t N = x.rows(), H = x.cols(), V = w.rows();  // x [N, H], w [V, H], labels [N]
  if (N == 0) return;
  const int64_t C = chunk_rows(N, H, V);
  // Labels are checked up front: a throw inside a pool task would terminate the process.
  const int32_t* lab = labels.ptr<int32_t>();  // [N]
  for (int64_t n = 0; n < N; ++n) {
    SF_CHECK(lab[n] == kIgnore || (lab[n] >= 0 && lab[n] < V), "linear_cross_entropy: label " + std::to_string(lab[n]) +
                                                                   " at row " + std::to_string(n) + " is outside [0, " +
                                                                   std::to_string(V) + ") and is not -100");
  }
  const bool want_grad = !dx.empty() || !dw.empty();
  float* logits = static_cast<float*>(ws.data);  // [C, V], becomes the gradient g in place
  float* xbuf = logits + C * V;                  // [C, H], x chunk (BF16 x) or dx chunk (BF16 dx)
  const float* wf = as_f32(w, 0);                // [V, H]
  float* dwf = nullptr;                          // [V, H] fp32 accumulator
  if (!dw.empty()) {
    // A BF16 dw is accumulated in fp32 over all chunks and rounded once at the end.
    dwf = dw.dtype == DType::F32 ? dw.ptr<float>() : scratch(1, size_t(V * H));
    if (dw.dtype == DType::BF16) load(dw, 0, V * H, dwf);
  }
  std::vector<double> row_loss(static_cast<size_t>(C));  // [C]
  std::vector<char> active(static_cast<size_t>(C));      // [C] 1 = row has a label
  double total = 0.0;

  for (int64_t n0 = 0; n0 < N; n0 += C) {
    const int64_t nc = std::min(C, N - n0);
    const float* xc = xbuf;  // [nc, H]
    if (x.dtype == DType::F32) {
      xc = x.ptr<float>() + n0 * H;
    } else {
      load(x, n0 * H, nc * H, xbuf);
    }
    sgemm(false, true, nc, V, H, 1.f, xc, H, wf, H, 0.f, logits, V);
    cpu_pool().parallel_for(
        nc,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            float* l = logits + i * V;  // [V]
            const int32_t y = lab[n0 + i];
            row_loss[size_t(i)] = 0.0;
            active[size_t(i)] = y != kIgnore;
            if (y == kIgnore) {
              if (want_grad) std::fill(l, l + V, 0.f);  // ignored rows get no gradient
              continue;
            }
            const double cap = softcap;
            if (cap > 0)
              for (int64_t j = 0; j < V; ++j) l[j] = float(cap * std::tanh(double(l[j]) / cap));
            float mx = l[0];
            for (int64_t j = 1; j < V; ++j) mx = std::max(mx, l[j]);
            double sum = 0.0;
            for (int64_t j = 0; j < V; ++j) sum += std::exp(double(l[j]) - double(mx));
            const double lse = double(mx) + std::log(sum);
            row_loss[size_t(i)] = lse - double(l[y]);
            if (!want_grad) continue;
            for (int64_t j = 0; j < V; ++j) {
              const double p = std::exp(double(l[j]) - lse);
              double g = (j == y ? p - 1.0 : p) * double(grad_scale);
              if (cap > 0) {
                const double t = double(l[j]) / cap;  // tanh(z / c), from the capped logit
                g *= 1.0 - t * t;
              }
              l[j] = float(g);
            }
          }
        },
        std::max<int64_t>(1, 16384 / std::max<int64_t>(1, V)));
    bool any = false;
    for (int64_t i = 0; i < nc; ++i) {
      total += row_loss[size_t(i)];  // in row order: same sum for any thread count
      any = any || active[size_t(i)];
    }
    if (!want_grad) continue;
    // dw before dx: dx may alias x, and a BF16 dx is staged in xbuf, which may hold the x chunk.
    if (dwf && any) sgemm(true, false, V, H, nc, 1.f, logits, V, xc, H, 1.f, dwf, H);
    if (!dx.empty()) {
      float* dxc = dx.dtype == DType::F32 ? dx.ptr<float>() + n0 * H : xbuf;  // [nc, H]
      if (any) {
        sgemm(false, false, nc, H, V, 1.f, logits, V, wf, H, 0.f, dxc, H);
      } else {
        std::fill(dxc, dxc + nc * H, 0.f);
      }
      if (dx.dtype == DType::BF16) store(dx, n0 * H, nc * H, xbuf);
    }
  }
  loss_sum.ptr<float>()[0] = float(double(loss_sum.ptr<float>()[0]) + total);
  if (dwf && dw.dtype == DType::BF16) store(dw, 0, V * H, dwf);
}

}  // namespace sf::cpu

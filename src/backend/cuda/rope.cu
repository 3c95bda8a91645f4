#include <algorithm>

#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/rope.cuh"

namespace sf::cuda {
namespace {

// Blocks walk the rows; inside a row, thread t handles (head, VEC pairs) items t, t+blockDim, ...
// Each item reads x[i..i+VEC) and x[i+half..i+half+VEC) and writes both back.
template <int VEC, bool INVERSE>
__global__ void rope_kernel(DOut x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                            const int32_t* __restrict__ pos_t, int64_t R, int T, int nh, int hd) {
  const int half = hd / 2, np = half / VEC, items = nh * np;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int pos = pos_t != nullptr ? pos_t[r] : int(r % T);  // pos_t [R] I32 or null
    const float* cr = cos_t + int64_t(pos) * half;
    const float* sr = sin_t + int64_t(pos) * half;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
      const int h = it / np, ip = it - h * np;
      const int64_t base = (r * nh + h) * hd + ip * VEC;
      float a[VEC], b[VEC], c[VEC], s[VEC];
      ldv<VEC>(x, base, a);
      ldv<VEC>(x, base + half, b);
      load_vec<VEC>(cr + ip * VEC, c);
      load_vec<VEC>(sr + ip * VEC, s);
      float y1[VEC], y2[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if (!INVERSE) {
          y1[k] = a[k] * c[k] - b[k] * s[k];
          y2[k] = b[k] * c[k] + a[k] * s[k];
        } else {
          y1[k] = a[k] * c[k] + b[k] * s[k];
          y2[k] = b[k] * c[k] - a[k] * s[k];
        }
      }
      stv<VEC>(x, base, y1);
      stv<VEC>(x, base + half, y2);
    }
  }
}

int n_heads_items(int nh, int half, int vec) { return nh * (half / vec); }

template <bool INVERSE>
void rope_launch(Tensor x, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, const Launch& L) {
  const int64_t R = x.rows();  // the arguments as ops_check.h checks them
  if (R == 0) return;
  const int32_t* pp = pos.empty() ? nullptr : pos.ptr<int32_t>();
  const int half = hd / 2;
  const bool vec = half % 8 == 0 && aligned16(x.data) && aligned16(cos.data) && aligned16(sin.data);
  const int items = n_heads_items(nh, half, vec ? 8 : 1);
  const int threads = std::clamp((items + 31) / 32 * 32, 32, 256);
  const unsigned grid = unsigned(std::min<int64_t>(R, int64_t(L.num_sms) * (2048 / threads)));
  if (vec) {
    rope_kernel<8, INVERSE>
        <<<grid, threads, 0, L.stream>>>(dout_(x), cos.ptr<float>(), sin.ptr<float>(), pp, R, T, nh, hd);
  } else {
    rope_kernel<1, INVERSE>
        <<<grid, threads, 0, L.stream>>>(dout_(x), cos.ptr<float>(), sin.ptr<float>(), pp, R, T, nh, hd);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos, const Launch& L) {
  rope_launch<false>(x, cos, sin, T, n_heads, head_dim, pos, L);
}
void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos, const Launch& L) {
  rope_launch<true>(dx, cos, sin, T, n_heads, head_dim, pos, L);
}

}  // namespace sf::cuda

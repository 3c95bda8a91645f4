#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernel_utils.cuh"

namespace sf::cuda {
namespace {

// The element functions of Map1 / Update / Map2 (kernel_utils.cuh); for_each runs them 8 elements a thread
// and step (16-byte bf16 / 2x16-byte f32 accesses) where the tensors are 16-byte aligned.
struct Plus {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct Times {
  float alpha;
  __device__ float operator()(float x) const { return x * alpha; }
};
struct Same {
  __device__ float operator()(float x) const { return x; }
};

}  // namespace

void add(Tensor out, Tensor a, Tensor b, const Launch& L) {
  const int64_t n = out.numel();
  for_each<8>(Map2<Plus>{dout_(out), din(a), din(b), Plus{}}, n,
              aligned16(out.data) && aligned16(a.data) && aligned16(b.data), L);
}

void scale(Tensor x, float alpha, const Launch& L) {
  const int64_t n = x.numel();
  for_each<8>(Update<Times>{dout_(x), Times{alpha}}, n, aligned16(x.data), L);
}

void cast(Tensor out, Tensor in, const Launch& L) {
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.dtype == in.dtype) {
    if (out.data != in.data)
      CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, L.stream));
    return;
  }
  SF_CHECK(is_float_dt(out.dtype) && is_float_dt(in.dtype), std::string("cast: the cuda backend converts only between "
                                                                        "F32 and BF16, not ") +
                                                                dt_name(in.dtype) + " to " + dt_name(out.dtype));
  for_each<8>(Map1<Same>{dout_(out), din(in), Same{}}, n, aligned16(out.data) && aligned16(in.data), L);
}

void zero(Tensor x, const Launch& L) {
  if (x.numel() == 0) return;
  CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), L.stream));
}

}  // namespace sf::cuda

// CUDA runtime error check for the benchmark programs: print file:line and the call, exit 1.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Median milliseconds of f() (work queued on stream s) over `iters` runs after `warm` warm-up runs,
// each timed by the events e0, e1 around it.
template <class F>
double median_event_ms(cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, F&& f, int warm, int iters) {
  for (int i = 0; i < warm; ++i) f();
  CK(cudaStreamSynchronize(s));
  std::vector<float> ts;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(e0, s));
    f();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

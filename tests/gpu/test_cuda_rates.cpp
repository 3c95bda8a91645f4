// `plan --measure` on a GPU (engine/rates.cpp): the attention kernel's forward and backward rates
// come back positive, finite and below the GEMM rate measured in the same call (attention is
// matrix products and a softmax).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/device.h"
#include "engine/rates.h"

namespace sf {
namespace {

TEST(CudaRates, MeasuresTheAttentionKernel) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const MeasuredRates m = measure_rates("cuda");
  ASSERT_GT(m.gemm_tflops, 0);
  for (double r : {m.rates.attn_fwd_tflops, m.rates.attn_bwd_tflops}) {
    EXPECT_TRUE(std::isfinite(r));
    EXPECT_GT(r, 0);
    EXPECT_LT(r, m.gemm_tflops);
  }
  EXPECT_NE(m.summary.find("attention forward"), std::string::npos) << m.summary;
  std::printf("%s\n", m.summary.c_str());
}

}  // namespace
}  // namespace sf

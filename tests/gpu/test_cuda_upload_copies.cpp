// Upload copies on the CUDA backend (docs/ENGINE.md "Uploads"): a host blob's bf16 working copy,
// written by the host AdamW pass beside the fp32 master and uploaded as is, must put the same bits
// in the GPU slots as an upload of the master cast on the GPU (both round to nearest even). So a
// step's loss with copies equals the loss without them bit for bit as long as the weights are the
// same: the first step's always. Later steps follow gradients whose last bits vary from run to run
// (the attention backward adds dQ with fp32 atomics), so the losses and the trained masters are held
// to twice the run-to-run difference of the engine without copies (or 1e-6 relative when those runs
// agree exactly); a copy that missed an update or was cast differently would differ at the scale of
// the update (lr 1e-2: far above). Clipping (the split update writes the copy in its parameter pass)
// and without (the fused pass as gradients land), every blob sliding and with the embedding and the
// head on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "../model_fixtures.h"
#include "../record_fixtures.h"
#include "train_compare.h"
#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/sliding_engine.h"
#include "model/spec.h"

namespace sf {
namespace {

using test::Trained;

Trained train(Device& dev, const ModelSpec& spec, const std::vector<int>& on_gpu, bool copies, double clip,
              const std::vector<Record>& recs) {
  SlidingOptions so;
  so.base.max_batch = 2;
  so.base.max_seq = 12;
  so.base.max_micro = 1;
  so.slots = 2;
  so.gpu_blobs = on_gpu;
  so.keep_grads = clip > 0;
  if (copies)
    for (int b = 0; b <= spec.n_layer + 1; ++b)
      if (std::find(on_gpu.begin(), on_gpu.end(), b) == on_gpu.end()) so.upload_copies.push_back(b);
  SlidingEngine e(dev, spec, so);
  return test::train_three_steps(e, recs, clip);
}

TEST(CudaUploadCopies, TrainAsTheMasterUploads) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(2) << 30);
  for (const std::string family : {"llama", "qwen3_moe"}) {
    const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
    const std::vector<Record> recs = test::random_records(int(spec.vocab), 6, 6);
    for (const double clip : {1.0, 0.0})
      for (const std::vector<int>& on_gpu :
           {std::vector<int>{}, std::vector<int>{0, spec.n_layer + 1}, std::vector<int>{0, 1, spec.n_layer + 1}}) {
        SCOPED_TRACE(family + (clip > 0 ? ", clip" : ", no clip") + ", " + std::to_string(on_gpu.size()) +
                     " blobs on the GPU");
        const Trained a = train(*dev, spec, on_gpu, false, clip, recs);
        const Trained again = train(*dev, spec, on_gpu, false, clip, recs);
        const Trained c = train(*dev, spec, on_gpu, true, clip, recs);
        const test::Difference d = test::expect_as_plain(a, again, c);
        // The uploads read the bf16 copies: half the fp32 masters' bytes.
        EXPECT_EQ(2 * c.stats.uploaded_bytes, a.stats.uploaded_bytes);
        std::printf("%s clip %.0f, %zu blobs on the GPU: masters with copies vs without %.3g of the largest "
                    "(run-to-run %.3g); uploaded %llu vs %llu bytes\n",
                    family.c_str(), clip, on_gpu.size(), d.worst, d.noise,
                    static_cast<unsigned long long>(c.stats.uploaded_bytes),
                    static_cast<unsigned long long>(a.stats.uploaded_bytes));
      }
  }
}

}  // namespace
}  // namespace sf

// Saving and resuming on the CUDA backend a part of a tensor at a time (Engine::read_state_part /
// write_state_part, what `train --resume` and the saves use for every tensor): parts of odd sizes
// read back the whole tensor's bits, and an engine written part by part holds the same masters and
// AdamW moments and computes with the same weights — its forward loss equals the original's bit for
// bit (the forward has no atomics; the compute copies are the masters rounded once, whether by the
// update or by the refresh of each written part). Both engines: resident, and sliding with the
// embedding and the head kept on the GPU (their state in device buffers, a bf16 compute copy
// refreshed part by part), without and with upload copies of the host blobs.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "../model_fixtures.h"
#include "../record_fixtures.h"
#include "train_compare.h"
#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {
namespace {

constexpr int64_t kReadPart = 37, kWritePart = 53;  // odd: parts straddle entries' rows

void check_parts(Engine& a, Engine& b, const ModelLayout& layout, const std::vector<Record>& recs) {
  test::train_three_steps(a, recs, 1.0);  // AdamW moments are not zero
  b.init_random(9);
  ASSERT_NO_FATAL_FAILURE(test::copy_saved_state_in_parts(a, b, layout, kReadPart, kWritePart));
  for (const test::SavedTensor& t : test::saved_tensors(layout)) {
    std::vector<float> x(static_cast<size_t>(t.e->numel)), y(static_cast<size_t>(t.e->numel), -1.f);
    a.read_state(t.which, t.blob, t.entry, x.data());
    b.read_state(t.which, t.blob, t.entry, y.data());
    ASSERT_EQ(x, y) << t.e->name;
  }
  const std::vector<Batch> eval = {make_batch({&recs[4], &recs[5]}, 11)};
  EXPECT_EQ(a.loss_sum(eval), b.loss_sum(eval)) << "the compute copies follow the written masters";
}

TEST(CudaState, PartsGiveTheWholeTensors) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(2) << 30);
  const ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  const ModelLayout layout = make_layout(spec);
  const std::vector<Record> recs = test::random_records(int(spec.vocab), 6, 6);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 12;
  {
    SCOPED_TRACE("resident");
    ResidentEngine a(*dev, spec, eo), b(*dev, spec, eo);
    check_parts(a, b, layout, recs);
  }
  for (bool copies : {false, true}) {
    SCOPED_TRACE(copies ? "sliding, upload copies" : "sliding");
    SlidingOptions so;
    so.base = eo;
    so.slots = 2;
    so.gpu_blobs = {0, spec.n_layer + 1};
    so.keep_grads = true;
    if (copies)
      for (int bl = 1; bl <= spec.n_layer; ++bl) so.upload_copies.push_back(bl);
    SlidingEngine a(*dev, spec, so), b(*dev, spec, so);
    check_parts(a, b, layout, recs);
  }
}

}  // namespace
}  // namespace sf

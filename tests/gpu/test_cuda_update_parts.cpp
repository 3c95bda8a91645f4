// Host updates in parts on the CUDA backend, without clipping, with the last layers' gradients
// held: (1) the embedding's gradient in two parts (docs/ENGINE.md "The embedding's rows"): the rows
// the step's tokens do not touch go down right after the head's backward on a stream of their own
// (rounded to bf16 through their own staging) and are updated there, the touched rows at the end;
// (2) held updates begun as their gradient lands (docs/ENGINE.md "Held updates begun early"): a
// share of each held blob's AdamW during the backward, the rest after it. AdamW is elementwise,
// so the trained weights are those of whole updates — up to the run-to-run difference of the
// engine itself (the attention backward adds dQ with fp32 atomics): held to twice that (or 1e-6
// relative when those runs agree exactly), the first step's loss bit for bit. A part missed or
// updated twice would differ at the scale of an update (lr 1e-2). Tied and untied tables, Gemma
// 3's scaled one; bf16 state too.
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

// rows: SlidingOptions::split_embedding_rows; early: SlidingOptions::hold_early.
Trained train(Device& dev, const ModelSpec& spec, bool rows, double early, bool bf16_state,
              const std::vector<Record>& recs) {
  SlidingOptions so;
  so.base.max_batch = 2;
  so.base.max_seq = 12;
  so.base.max_micro = 1;
  if (bf16_state) so.base.state_dtype = DType::BF16;
  so.slots = 2;
  so.keep_grads = false;
  so.hold_grads = int64_t(1) << 40;  // every blob but the embedding: the host idles after the head
  so.split_embedding_rows = rows;
  so.hold_early = early;
  SlidingEngine e(dev, spec, so);
  return test::train_three_steps(e, recs, 0);
}

// Training with the parts on, each against whole updates (twice: the run-to-run bound).
void expect_as_whole(const char* what, bool rows, double early) {
  auto dev = make_cuda_device(size_t(2) << 30);
  for (const std::string family : {"llama", "qwen3", "gemma3"})
    for (const bool bf16_state : {false, true}) {
      SCOPED_TRACE(family + (bf16_state ? ", bf16 state" : ""));
      const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
      const std::vector<Record> recs = test::random_records(int(spec.vocab), 6, 6);
      const Trained a = train(*dev, spec, false, 0, bf16_state, recs);
      const Trained again = train(*dev, spec, false, 0, bf16_state, recs);
      const Trained r = train(*dev, spec, rows, early, bf16_state, recs);
      EXPECT_EQ(a.stats.embedding_row_splits + a.stats.early_updates, 0u);
      if (rows) {
        EXPECT_EQ(r.stats.embedding_row_splits, 3u) << "the embedding did not go down in two parts";
      }
      if (early > 0) {
        EXPECT_GT(r.stats.early_updates, 0u) << "no held update begun as its gradient landed";
      }
      const test::Difference d = test::expect_as_plain(a, again, r);
      std::printf("%s%s: masters with %s vs whole %.3g of the largest (run-to-run %.3g)\n", family.c_str(),
                  bf16_state ? " bf16 state" : "", what, d.worst, d.noise);
    }
}

TEST(CudaUpdateParts, EmbeddingRowsTrainAsTheWholeTable) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  expect_as_whole("the rows in two parts", true, 0);
}

TEST(CudaUpdateParts, HeldUpdatesBegunEarlyTrainAsWhole) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  expect_as_whole("held updates 40 % early", false, 0.4);
}

}  // namespace
}  // namespace sf

// The sliding engine against the resident (in-memory) engine on the cpu backend: same op order,
// so the same losses and weights bit for bit, for every family, slot count and with random
// delays injected into every stream (a missing event dependency shows up as a difference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>

#include "backend/cpu/cpu_device.h"
#include "data/dataset/dataset.h"
#include "engine/planner.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "engine/state_stream.h"
#include "engine_state.h"
#include "model_fixtures.h"
#include "record_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

using HostParams = test::NamedTensors;

using test::random_records;

#if defined(__SANITIZE_THREAD__)  // gcc; clang: __has_feature
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
constexpr bool kThreadSanitizer = __has_feature(thread_sanitizer);
#else
constexpr bool kThreadSanitizer = false;
#endif

// Runs `steps` optimizer steps of `micro` micro-batches (2 records each) through Engine::step and
// returns the losses and final parameters. Without clipping the sliding engine updates each blob
// as its gradient lands, during the backward.
// `first`: the first step's number (continuing a run: the records from where it stopped).
std::pair<std::vector<double>, HostParams> train(Engine& e, const std::vector<Record>& recs, int steps, int micro,
                                                 double clip, int first = 1) {
  std::vector<double> losses;
  size_t next = size_t(first - 1) * size_t(micro) * 2;
  for (int s = first; s < first + steps; ++s) {
    std::vector<Batch> mbs;
    for (int j = 0; j < micro; ++j) {
      const Record* a = &recs[next++ % recs.size()];
      const Record* b = &recs[next++ % recs.size()];
      mbs.push_back(make_batch({a, b}, 11));
    }
    Engine::StepParams p;
    p.adamw.lr = 1e-2f * float(s);  // changes every step: a stale schedule would show
    p.adamw.weight_decay = 0.1f;
    p.adamw.step = s;
    p.adamw.round_seed = 77;  // bf16 optimizer state: the rounding's stream (fp32 state ignores it)
    p.max_grad_norm = clip;
    const Engine::StepResult r = e.step(mbs, p);
    EXPECT_TRUE(r.updated);
    losses.push_back(r.loss);
  }
  return {losses, test::export_state(e, ResidentEngine::State::Params)};
}

struct Case {
  std::string family;
  int slots;
  int delay_us;
  uint64_t stall_streams = 0;  // bits by creation order: 0 compute, 1 h2d, 2 d2h, 3 token uploads, 4 opt
  bool overlap = false;        // no clipping: AdamW per gradient chunk during the backward (the ring)
  // Transfer chunks of 37 elements (every blob in several odd chunks: uploads, gradient ring) and a
  // 2-buffer gradient ring, rather than one chunk a blob.
  bool small_chunks = false;
  // Blobs kept on the GPU: 0 none, 1 embedding + head, 2 embedding + layer 1 + head, 3 all, 4 all but
  // the embedding.
  int gpu = 0;
  bool bf16 = false;        // --compute-dtype bf16 in both engines: gradients rounded to bf16 (as on cuda)
  int micro = 1;            // micro-batches a step (layer-major in the sliding engine)
  int64_t hold = 0;         // SlidingOptions::hold_grads (overlap): the last blobs updated after the backward
  bool fused = false;       // clipping: one AdamW pass a blob (SlidingOptions::split_update off)
  bool bf16_state = false;  // AdamW m and v in bf16, stochastically rounded (EngineOptions::state_dtype)
  // The NVMe tier: 0 none, 1 the even host layers' AdamW state in the store, 2 every host blob's;
  // the store's pieces complete after random delays (out of order) and come back short once.
  int disk = 0;
  bool uring = true;  // the store's io_uring backend (else worker threads)
  int ckpt_disk = 0;  // the first layers whose checkpoints are in the store (the I/O stream: bit 5)
  // Levels 3-4 of the tier over the `disk` blobs: 3 their fp32 masters in the store too (the uploads
  // read a working copy in host memory), 4 their working copies too (read ahead of each upload on
  // an I/O stream of the host optimizer's, created before the token uploader's: stall bits then
  // 3 weight reads, 4 tokens, 5 opt, 6 checkpoint I/O), 5 masters of all, working copies of every
  // other one (both kinds side by side).
  int tier = 0;
  // With clipping: the `disk` blobs' held gradients in the store too (written as they land on
  // the host optimizer's gradient I/O stream, read with the state by the update; that stream is
  // created before the weight reads' and the token uploader's: stall bit 3).
  bool grads_disk = false;
  bool cufile = false;               // ... moved by cuFile (the test stand-in, tests/fake_cufile/), no pinned ring
  bool refuse_registration = false;  // the kernel refuses to register the rings: plain reads and writes
  // Selective recompute in the sliding engine only (the resident engine recomputes every layer):
  // the first `whole` layers kept whole, the next `attn` keeping attention's output, per micro-batch.
  int whole = 0, attn = 0;
  // The state ring reads ahead into the checkpoints the backward has consumed (StateStream::lend):
  // checkpoint buffers made large enough to hold a piece (SlidingOptions::ckpt_stride_min).
  bool lend = false;
  // Upload copies (SlidingOptions::upload_copies): every host blob whose state is in host memory
  // keeps a working copy in the compute dtype beside its master, written by its update, read by
  // its uploads.
  bool copies = false;
  // The embedding's gradient in two parts (SlidingOptions::split_embedding_rows): every step's
  // (the test asserts that it ran), or off (the whole table at the end, as before).
  bool rows_split = false;
  bool no_rows_split = false;
  // Held updates begun as their gradient lands (SlidingOptions::hold_early), in percent of each
  // held blob's elements; the test asserts that some ran.
  int early = 0;
  // A vocabulary of 400: the (tied) table larger than a layer, as in real models (the tiny one's is
  // smaller), so the large slot holds only it and the layers share the others.
  bool big_vocab = false;
};

// The host blobs whose AdamW state goes to the store.
std::vector<int> disk_blobs(int which, int n_layer, const std::vector<int>& on_gpu) {
  std::vector<int> out;
  for (int b = 0; b <= n_layer + 1 && which > 0; ++b) {
    if (std::find(on_gpu.begin(), on_gpu.end(), b) != on_gpu.end()) continue;
    if (which == 2 || (b >= 1 && b <= n_layer && b % 2 == 0)) out.push_back(b);
  }
  return out;
}

std::vector<int> gpu_blobs(int which, int n_layer) {
  const int head = n_layer + 1;
  switch (which) {
    case 1:
      return {0, head};
    case 2:
      return {0, 2, head};
    case 4: {  // every blob but the embedding
      std::vector<int> all;
      for (int b = 1; b <= head; ++b) all.push_back(b);
      return all;
    }
    case 3: {
      std::vector<int> all;
      for (int b = 0; b <= head; ++b) all.push_back(b);
      return all;
    }
    default:
      return {};
  }
}

class SlidingVsResident : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.family + "_slots" + std::to_string(c.slots) +
         (c.stall_streams ? "_stalls" + std::to_string(c.stall_streams) : "") + (c.overlap ? "_overlap" : "") +
         (c.small_chunks ? "_chunks" : "") + (c.gpu ? "_gpu" + std::to_string(c.gpu) : "") + (c.bf16 ? "_bf16" : "") +
         (c.micro > 1 ? "_micro" + std::to_string(c.micro) : "") + (c.hold ? "_hold" + std::to_string(c.hold) : "") +
         (c.fused ? "_fused" : "") + (c.bf16_state ? "_bf16state" : "") +
         (c.disk ? "_disk" + std::to_string(c.disk) : "") +
         (c.ckpt_disk ? "_ckptdisk" + std::to_string(c.ckpt_disk) : "") +
         ((c.disk || c.ckpt_disk) && !c.uring ? "_threads" : "") + (c.tier ? "_tier" + std::to_string(c.tier) : "") +
         (c.grads_disk ? "_gradsdisk" : "") + (c.cufile ? "_cufile" : "") +
         (c.refuse_registration ? "_unregistered" : "") +
         (c.whole || c.attn ? "_keep" + std::to_string(c.whole) + "w" + std::to_string(c.attn) + "a" : "") +
         (c.lend ? "_lend" : "") + (c.copies ? "_copies" : "") + (c.rows_split ? "_rows" : "") +
         (c.no_rows_split ? "_norows" : "") + (c.early ? "_early" + std::to_string(c.early) : "") +
         (c.big_vocab ? "_bigvocab" : "");
}

// The host blobs without state in the store: those that get upload copies.
std::vector<int> copy_blobs(int n_layer, const std::vector<int>& on_gpu, const std::vector<int>& on_disk) {
  std::vector<int> out;
  for (int b = 0; b <= n_layer + 1; ++b)
    if (std::find(on_gpu.begin(), on_gpu.end(), b) == on_gpu.end() &&
        std::find(on_disk.begin(), on_disk.end(), b) == on_disk.end())
      out.push_back(b);
  return out;
}

TEST_P(SlidingVsResident, SameLossesAndWeightsBitForBit) {
  const Case c = GetParam();
  nlohmann::json cfg = test::tiny_config(c.family);
  if (c.stall_streams) cfg["num_hidden_layers"] = 4;  // buffers alternate: reuse within one pass
  if (c.big_vocab) cfg["vocab_size"] = 400;
  ModelSpec spec = parse_model_spec(cfg, "tiny");
  auto recs = random_records(int(spec.vocab), 21, 7);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 11;
  eo.max_micro = c.micro;
  if (c.bf16) eo.compute_dtype = "bf16";
  if (c.bf16_state) eo.state_dtype = DType::BF16;

  auto dev_r = make_cpu_device();
  ResidentEngine r(*dev_r, spec, eo);
  r.init_random(5);
  const double clip = c.overlap ? 0 : 0.5;
  auto [lr, pr] = train(r, recs, 3, c.micro, clip);

  CpuDeviceOptions o;
  o.max_delay_us = c.delay_us;
  o.stall_us = 3000;
  o.stall_every = 4;
  o.stall_streams = c.stall_streams;  // one slow stream at a time exposes a missing wait on it
  auto dev_s = make_cpu_device(o);
  SlidingOptions so;
  so.base = eo;
  so.slots = c.slots;
  so.gpu_blobs = gpu_blobs(c.gpu, spec.n_layer);
  so.keep_grads = !c.overlap;
  so.hold_grads = c.hold;
  so.split_update = !c.fused;
  so.split_embedding_rows = !c.no_rows_split;
  so.hold_early = c.early / 100.0;
  so.base.whole_layers = std::min(c.whole, spec.n_layer);
  so.base.kept_layers = std::min(c.attn, spec.n_layer - so.base.whole_layers);
  if (c.small_chunks) {
    so.chunk = 37;
    so.grad_ring = 2;
    so.fill_window = 1013;  // set-up's fills cut entries, chunks of the generator and store pieces
    // Under ASan the NVMe-tier cases took 64 s of CPU each (half of it system time: every 37-element
    // transfer and update is its own task), the ASan stage's longest tests (138-250 s in CI); under
    // TSan the held gradients' cases took 184-260 s each (every 37-element chunk of gradient is a
    // block-aligned store write, waited for through a 2-chunk ring). There: chunks of 149 (still odd,
    // still ~50 a layer). TSan keeps 37 for the other disk cases (17-32 s each): the state, weight
    // and checkpoint rings' interleavings in many chunks are its point.
    if (test::kSanitizerBuild && (c.disk || c.ckpt_disk) && (c.grads_disk || !kThreadSanitizer)) so.chunk = 149;
  }
  test::TempDir store_dir;
  so.disk_blobs = disk_blobs(c.disk, spec.n_layer, so.gpu_blobs);
  so.ckpt_disk_layers = c.ckpt_disk;
  if (c.tier >= 3) so.disk_masters = so.disk_blobs;
  if (c.grads_disk) so.disk_grads = so.disk_blobs;
  for (size_t i = 0; c.tier >= 4 && i < so.disk_masters.size(); ++i)
    if (c.tier == 4 || i % 2 == 0) so.disk_weights.push_back(so.disk_masters[i]);
  if (!so.disk_blobs.empty() || c.ckpt_disk > 0) {
    so.store.dir = store_dir.path.string();
    so.store.piece = 4096;  // every blob's state in several pieces
    so.store.depth = 3;
    so.store.uring = c.uring;
    so.store.faults.max_delay_us = c.delay_us * 4;
    so.store.faults.short_transfers = true;
    so.store.faults.refuse_registration = c.refuse_registration;
    so.disk_ring = 2;
    so.disk_piece = StateStream::kPieceAlign;  // every blob's state read and written in several pieces
    if (c.cufile) {
      so.store.cufile = SF_FAKE_CUFILE;
      so.store.direct = false;  // the stand-in's pread/pwrite take any buffer
    }
  }
  if (c.lend) so.ckpt_stride_min = 24 << 10;  // a piece's m and v (16 KiB) in one, more across two
  if (c.copies) so.upload_copies = copy_blobs(spec.n_layer, so.gpu_blobs, so.disk_blobs);
  SlidingEngine s(*dev_s, spec, so);
  s.init_random(5);
  auto [ls, ps] = train(s, recs, 3, c.micro, clip);
  if (c.lend && !c.overlap) {
    EXPECT_GT(s.stats().disk_state_lent, 0u) << "no piece of state read into a lent checkpoint";
  }
  if (c.rows_split) {
    EXPECT_EQ(s.stats().embedding_row_splits, 3u) << "the embedding did not go down in two parts";
  }
  if (c.no_rows_split) {
    EXPECT_EQ(s.stats().embedding_row_splits, 0u);
  }
  if (c.early) {
    EXPECT_GT(s.stats().early_updates, 0u) << "no held update begun as its gradient landed";
  }

  // Layer-major micro-batches add every head's gradient into a tied embedding before the
  // embeddings' own; the resident engine's step defers its embedding backwards to do the same.
  EXPECT_EQ(lr, ls);
  ASSERT_EQ(pr.size(), ps.size());
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_EQ(pr[i].data, ps[i].data) << pr[i].name;
  for (auto which : {Engine::State::AdamM, Engine::State::AdamV}) {  // the moments too (bf16 state: rounded alike)
    const HostParams mr = test::export_state(r, which), ms = test::export_state(s, which);
    for (size_t i = 0; i < mr.size(); ++i) EXPECT_EQ(mr[i].data, ms[i].data) << mr[i].name;
  }
  if (c.cufile) {
    EXPECT_GT(s.stats().disk_gpu_direct, 0u) << "checkpoints through cuFile";
  }
  if (c.uring &&
      (c.disk || c.ckpt_disk)) {  // the checkpoints', the state's and the weights' rings registered with io_uring
    const int rings = (c.disk > 0) + (c.ckpt_disk > 0 && !c.cufile) + (c.disk > 0 && c.tier >= 4);
    const std::string want = std::to_string(rings) + " registered buffer" + (rings > 1 ? "s" : "");
    if (c.refuse_registration) {
      EXPECT_NE(s.stats().disk_io.find("buffers not registered"), std::string::npos) << s.stats().disk_io;
    } else if (rings > 0) {
      EXPECT_NE(s.stats().disk_io.find(want), std::string::npos) << s.stats().disk_io;
    }
  }
  if (c.gpu == 3)
    EXPECT_EQ(s.uploads(), 0);  // every blob on the GPU: nothing slides
  else
    EXPECT_GT(s.uploads(), 0);
  if (c.whole || c.attn) {  // selective recompute: the same bits as the sliding engine recomputing every layer
    SlidingOptions full = so;
    full.base.whole_layers = full.base.kept_layers = 0;
    auto dev_f = make_cpu_device(o);
    SlidingEngine f(*dev_f, spec, full);
    f.init_random(5);
    auto [lf, pf] = train(f, recs, 3, c.micro, clip);
    EXPECT_EQ(lf, ls);
    for (size_t i = 0; i < pf.size(); ++i) EXPECT_EQ(pf[i].data, ps[i].data) << pf[i].name;
    EXPECT_GT(s.device_bytes(), f.device_bytes());  // the kept buffers
  }
  if (c.copies) {  // the same bits as the sliding engine without copies; the uploads read the copies
    SlidingOptions plain = so;
    plain.upload_copies.clear();
    auto dev_p = make_cpu_device(o);
    SlidingEngine f(*dev_p, spec, plain);
    f.init_random(5);
    auto [lf, pf] = train(f, recs, 3, c.micro, clip);
    EXPECT_EQ(lf, ls);
    for (size_t i = 0; i < pf.size(); ++i) EXPECT_EQ(pf[i].data, ps[i].data) << pf[i].name;
    // What the uploads read from host memory: the copies in the compute dtype (bf16: half of the
    // fp32 masters' bytes; fp32 compute, the cpu backend's default: a copy is a master's size).
    const uint64_t with = s.stats().uploaded_bytes, without = f.stats().uploaded_bytes;
    ASSERT_EQ(s.uploads(), f.uploads());
    if (c.disk == 0) {
      EXPECT_EQ(c.bf16 ? 2 * with : with, without);
    } else {
      EXPECT_LE(with, without);
    }
    if (c.bf16 && c.disk == 0) {  // split masters: the copy and the low halves, no fp32 master
      EXPECT_LT(s.stats().pinned_bytes, f.stats().pinned_bytes);
      EXPECT_GT(s.host_bytes(), f.host_bytes());  // by the tie bits
      EXPECT_LT(s.host_bytes(), f.host_bytes() + f.host_bytes() / 16);
    } else {
      EXPECT_GT(s.host_bytes(), f.host_bytes());  // the copies' pinned memory
    }
  }
}

// Fields: family, slots, delay_us, stall_streams, overlap, small_chunks, gpu, bf16, micro.
INSTANTIATE_TEST_SUITE_P(
    Engines, SlidingVsResident,
    ::testing::Values(
        Case{"llama", 3, 0}, Case{"mistral", 2, 0}, Case{"qwen2", 5, 0}, Case{"qwen3", 3, 0}, Case{"llama", 3, 50, 1},
        Case{"qwen3", 2, 50, 2}, Case{"mistral", 4, 50, 4}, Case{"qwen2", 3, 50, 8}, Case{"llama", 2, 50, 4},
        Case{"qwen3", 3, 0, 0, true}, Case{"llama", 2, 50, 2, true}, Case{"mistral", 3, 50, 4, true},
        Case{"qwen2", 4, 50, 1, true}, Case{"llama", 2, 50, 16}, Case{"qwen3", 3, 50, 16, true},
        Case{"llama", 3, 0, 0, false, true}, Case{"qwen2", 2, 50, 16, false, true},
        Case{"mistral", 3, 50, 4, true, true}, Case{"qwen3", 2, 50, 4, true, true},
        Case{"llama", 2, 50, 16, true, true}, Case{"qwen2", 3, 50, 2, true, true},
        Case{"llama", 3, 0, 0, false, false, 1}, Case{"qwen2", 2, 50, 2, false, false, 2},
        Case{"mistral", 3, 50, 4, true, false, 1}, Case{"qwen3", 2, 50, 16, true, false, 2},
        Case{"llama", 2, 50, 1, false, true, 2}, Case{"qwen2", 3, 0, 0, true, false, 3},
        Case{"mistral", 2, 50, 4, false, false, 3},
        // bf16 compute: gradients rounded to bf16 on the way down, in both engines
        Case{"llama", 3, 0, 0, false, false, 0, true}, Case{"qwen3", 2, 50, 4, true, true, 0, true},
        Case{"qwen2", 2, 50, 16, false, true, 2, true}, Case{"mistral", 3, 50, 2, true, false, 1, true},
        // layer-major micro-batches
        Case{"llama", 3, 0, 0, false, false, 0, false, 3}, Case{"qwen2", 2, 50, 4, true, true, 0, false, 4},
        Case{"llama", 2, 50, 2, false, true, 2, true, 2}, Case{"qwen2", 3, 50, 16, true, false, 1, false, 3},
        Case{"mistral", 3, 0, 0, false, false, 0, false, 3}, Case{"qwen3", 2, 50, 4, true, true, 2, true, 2},
        Case{"llama", 2, 50, 8, false, false, 0, false, 2}, Case{"qwen2", 2, 50, 1, true, true, 0, true, 3},
        // without clipping, the first blobs' gradients held and updated after the backward
        Case{"llama", 3, 0, 0, true, false, 0, false, 1, 1}, Case{"qwen3", 2, 50, 4, true, true, 0, true, 1, 3000},
        Case{"mistral", 3, 50, 16, true, false, 1, false, 2, 5000},
        Case{"qwen2", 2, 50, 2, true, true, 0, false, 1, 1 << 30},
        Case{"llama", 2, 50, 1, true, false, 2, true, 3, 2000},
        // clipping with one fused AdamW pass a blob (the others split it in two)
        Case{"qwen3", 3, 0, 0, false, false, 0, false, 1, 0, true},
        Case{"llama", 2, 50, 16, false, true, 1, true, 2, 0, true},
        // bf16 optimizer state (stochastic rounding keyed by step, blob and element): split and
        // fused updates, updates during the backward in odd chunks, blobs kept on the GPU, stalls
        Case{"llama", 3, 0, 0, false, false, 0, false, 1, 0, false, true},
        Case{"qwen3", 2, 50, 4, false, true, 2, true, 2, 0, false, true},
        Case{"mistral", 3, 50, 16, true, true, 1, false, 1, 0, false, true},
        Case{"qwen2", 2, 50, 2, false, false, 3, false, 1, 0, true, true},
        Case{"llama", 2, 50, 8, true, false, 0, true, 3, 3000, false, true},
        Case{"qwen3", 3, 50, 1, false, true, 0, false, 2, 0, true, true},
        // Gemma 3: local (window 4 < seq 11) and global layers, sandwich norms, GeGLU, embedding scale
        Case{"gemma3", 3, 0}, Case{"gemma3", 2, 50, 4, true, true}, Case{"gemma3", 2, 50, 16, false, false, 2, true, 2},
        Case{"gemma3", 3, 50, 2, true, false, 1, false, 3},
        // mixture of experts: the load-balancing loss's router statistics per micro-batch
        Case{"qwen3_moe", 3, 0}, Case{"mixtral", 2, 50, 4, true, true}, Case{"olmoe", 3, 50, 2},
        Case{"qwen3_moe", 2, 50, 16, false, false, 0, false, 3}, Case{"mixtral", 3, 0, 0, false, false, 1, true, 2},
        Case{"olmoe", 2, 50, 1, true, false, 2, true, 2},
        // the NVMe tier: AdamW state of some or all host blobs in the store, read ahead and
        // written back around each update, through either backend, with disordered completions
        Case{"llama", 3, 0, 0, false, false, 0, false, 1, 0, false, false, 2},
        Case{"qwen3", 2, 50, 16, false, false, 0, false, 1, 0, false, false, 1, false},
        Case{"mistral", 3, 50, 4, true, false, 0, false, 1, 0, false, false, 2},
        Case{"qwen2", 2, 50, 16, true, true, 1, true, 2, 0, false, false, 1, false},
        Case{"llama", 2, 50, 2, true, false, 0, false, 1, 3000, false, false, 2, false},
        Case{"qwen3", 3, 50, 16, false, true, 2, true, 2, 0, true, false, 2},
        Case{"llama", 2, 0, 0, false, false, 0, false, 3, 0, false, false, 1},
        // ... and the first layers' checkpoints in the store, through the I/O stream (stalled: 32)
        Case{"qwen2", 3, 50, 32, false, false, 0, false, 1, 0, false, false, 0, true, 1},
        Case{"llama", 2, 50, 32, true, true, 0, false, 3, 0, false, false, 2, true, 4},
        Case{"mistral", 3, 50, 4, false, false, 1, true, 2, 0, false, false, 1, false, 2},
        Case{"qwen3", 2, 50, 2, true, false, 0, false, 4, 0, false, false, 2, true, 3},
        // bf16 optimizer state in the store: the ring carries 2-byte moments
        Case{"qwen2", 2, 50, 16, true, false, 0, false, 2, 0, false, true, 2, false, 1},
        Case{"llama", 3, 50, 4, false, true, 1, true, 1, 0, false, true, 1, true, 2},
        Case{"gemma3", 2, 50, 16, true, false, 0, false, 2, 0, false, false, 2, true, 2},
        // levels 3-4: fp32 masters in the store (working copies in host memory), then the working
        // copies too (read into a pinned ring ahead of each upload); clipping and updates during
        // the backward, bf16 compute and state, micro-batches, checkpoints there too, stalls on
        // each stream of the tier (8: the weight reads, 32: the host updates, 64: checkpoint I/O)
        Case{"llama", 3, 0, 0, false, false, 0, false, 1, 0, false, false, 2, true, 0, 3},
        Case{"qwen3", 2, 50, 4, true, false, 0, true, 2, 0, false, false, 2, true, 0, 3},
        Case{"llama", 2, 0, 0, false, false, 0, false, 1, 0, false, false, 2, true, 0, 4},
        Case{"mistral", 2, 50, 8, false, true, 0, true, 2, 0, false, true, 2, false, 0, 4},
        Case{"qwen2", 3, 50, 2, true, false, 1, false, 3, 0, false, false, 1, true, 2, 4},
        Case{"llama", 2, 50, 32, true, true, 0, true, 1, 3000, false, false, 2, true, 0, 5},
        Case{"qwen3", 2, 50, 64, false, false, 0, false, 2, 0, true, true, 2, true, 3, 5},
        Case{"gemma3", 2, 50, 16, false, false, 0, true, 2, 0, false, false, 2, true, 1, 4},
        // the held gradients (clipping) in the store: alone, with every level, odd chunks, split
        // and fused updates, stalls on the tier's first I/O stream (8) and on the host updates' (64)
        Case{"llama", 3, 0, 0, false, false, 0, false, 1, 0, false, false, 2, true, 0, 0, true},
        Case{"qwen3", 2, 50, 8, false, true, 0, true, 2, 0, false, false, 1, true, 0, 0, true},
        Case{"mistral", 2, 50, 8, false, true, 0, true, 3, 0, true, true, 2, false, 2, 4, true},
        Case{"qwen2", 3, 50, 64, false, false, 1, false, 2, 0, false, false, 2, true, 1, 5, true},
        Case{"gemma3", 2, 50, 4, false, true, 0, true, 2, 0, false, false, 2, true, 0, 3, true},
        // checkpoints through cuFile (GPUDirect Storage): GPU copies into the fetch buffers, no
        // pinned ring; stalls on the I/O stream (32), d2h (4), h2d (2) and compute (1)
        Case{"qwen2", 3, 50, 32, false, false, 0, false, 1, 0, false, false, 0, true, 1, 0, false, true},
        Case{"llama", 2, 50, 4, true, true, 0, false, 3, 0, false, false, 2, true, 4, 0, false, true},
        Case{"mistral", 3, 50, 2, false, false, 1, true, 2, 0, false, false, 1, false, 2, 0, false, true},
        Case{"qwen3", 2, 50, 1, true, false, 0, false, 2, 0, false, true, 0, true, 4, 0, false, true},
        // the rings not registered (the kernel refuses, past RLIMIT_MEMLOCK): the same bytes through
        // plain reads and writes, with and without clipping, every level, stalls on the host updates
        Case{"llama", 2, 50, 32, false, true, 0, true, 2, 0, false, false, 2, true, 2, 5, true, false, true},
        Case{"qwen2", 3, 50, 16, true, false, 0, false, 1, 0, false, true, 1, true, 1, 4, false, false, true}),
    case_name);

// Every path of the schedule (engine/step_schedule.h; tests/test_step_schedule.cpp checks each
// one's description): clipping x split update x held gradients x blobs kept on the GPU, 16 cases,
// each with a different stalled stream, 2 micro-batches and odd chunks in every other case, bf16
// compute in a quarter of them.
std::vector<Case> every_mode() {
  std::vector<Case> v;
  const char* const family[] = {"llama", "qwen3", "mistral", "qwen2"};
  const uint64_t stall[] = {1, 2, 4, 8, 16};
  for (int i = 0; i < 16; ++i) {
    const bool clip = i & 1, split = i & 2, held = i & 4, kept = i & 8;
    Case c{family[i % 4], 2 + i % 2, 50, stall[i % 5]};
    c.overlap = !clip;
    c.fused = !split;
    c.hold = held ? 3000 : 0;
    c.gpu = kept ? 2 : 0;
    c.small_chunks = i % 2 == 0;
    c.micro = 1 + (i / 2) % 2;
    c.bf16 = i % 4 == 3;
    v.push_back(c);
  }
  return v;
}
// The state ring's read-ahead into lent checkpoints (docs/ENGINE.md "Read-ahead into freed
// checkpoints"), 4 layers: clipping with several micro-batches, one stream stalled at a time (h2d:
// the lends; d2h: the reclaims before each offload; opt: the updates that consume the pieces; the
// gradients' I/O stream), disordered and short store transfers, held gradients, masters and working
// copies in the store, bf16 state, checkpoints of the first layer on disk, and without clipping.
std::vector<Case> lend_cases() {
  std::vector<Case> out;
  auto add = [&](const char* family, int slots, uint64_t stall, int micro, auto&& set) {
    Case c{family, slots, 50, stall};
    c.micro = micro;
    c.disk = 2;
    c.lend = true;
    set(c);
    out.push_back(c);
  };
  auto none = [](Case&) {};
  add("llama", 3, 0, 2, none);
  add("qwen2", 2, 2, 2, none);                                    // h2d stalled (the lends)
  add("llama", 3, 4, 3, none);                                    // d2h stalled (the reclaims)
  add("qwen3", 3, 16, 2, none);                                   // opt stalled (the updates)
  add("mistral", 2, 8, 1, [](Case& c) { c.grads_disk = true; });  // the gradients' I/O stream stalled
  add("llama", 2, 4, 2, [](Case& c) { c.grads_disk = true; });
  add("qwen2", 3, 16, 2, [](Case& c) { c.tier = 3; });
  add("llama", 3, 8, 2, [](Case& c) { c.tier = 4; });  // the weight reads' stream stalled
  add("qwen3", 2, 2, 2, [](Case& c) { c.bf16_state = true; });
  add("mistral", 3, 32, 2, [](Case& c) { c.ckpt_disk = 1; });  // the checkpoints' I/O stream stalled
  add("llama", 3, 4, 2, [](Case& c) { c.overlap = true; });
  add("qwen2", 2, 16, 1, [](Case& c) {
    c.disk = 1;
    c.gpu = 2;
  });
  return out;
}
INSTANTIATE_TEST_SUITE_P(Lending, SlidingVsResident, ::testing::ValuesIn(lend_cases()), case_name);

// Upload copies (SlidingOptions::upload_copies): the update writes each host blob's working copy
// in the same pass as its master (the fused pass, or the split update's parameter pass) and the
// uploads read it. Against the resident engine and the sliding engine without copies, byte for
// byte: clipping (split and fused updates) and without (the gradient ring, held gradients), 1-2
// micro-batches, blobs kept on the GPU, bf16 and fp32 compute, bf16 state, odd chunks, state of
// some blobs in the store beside the copies of the others (masters there too: their working copies
// and the upload copies in one buffer), each with a stalled stream (1 compute, 2 h2d: the uploads
// that read the copies, 4 d2h, 16 opt: the updates that write them).
std::vector<Case> copy_cases() {
  std::vector<Case> out;
  auto add = [&](const char* family, int slots, uint64_t stall, auto&& set) {
    Case c{family, slots, stall ? 50 : 0, stall};
    c.copies = true;
    c.bf16 = true;
    set(c);
    out.push_back(c);
  };
  auto none = [](Case&) {};
  add("llama", 3, 0, none);                                // clipping, split update
  add("qwen3", 2, 16, [](Case& c) { c.overlap = true; });  // the ring, opt stalled
  add("mistral", 3, 2, [](Case& c) {                       // the ring, held gradients, h2d stalled
    c.overlap = true;
    c.hold = 3000;
    c.micro = 2;
  });
  add("qwen2", 2, 4, [](Case& c) {  // grad-accum 2, blobs on the GPU, d2h stalled
    c.micro = 2;
    c.gpu = 2;
  });
  add("llama", 2, 16, [](Case& c) {  // fused update, embedding and head on the GPU, odd chunks
    c.fused = true;
    c.gpu = 1;
    c.small_chunks = true;
  });
  add("qwen3", 3, 2, [](Case& c) {  // the ring in odd chunks, grad-accum 2, bf16 state
    c.overlap = true;
    c.small_chunks = true;
    c.micro = 2;
    c.bf16_state = true;
  });
  add("llama", 3, 1, [](Case& c) { c.bf16 = false; });  // fp32 compute (a copy is a master's size)
  add("mistral", 2, 4, [](Case& c) {                    // fp32 compute, the ring, grad-accum 2, GPU blobs
    c.bf16 = false;
    c.overlap = true;
    c.micro = 2;
    c.gpu = 2;
  });
  add("gemma3", 2, 16, [](Case& c) { c.micro = 2; });
  add("olmoe", 3, 2, [](Case& c) { c.overlap = true; });
  add("qwen2", 3, 16, [](Case& c) {  // the odd layers' state, masters too, in the store
    c.disk = 1;
    c.tier = 3;
    c.micro = 2;
  });
  add("llama", 2, 2, [](Case& c) {  // ... without clipping
    c.disk = 1;
    c.tier = 3;
    c.overlap = true;
  });
  return out;
}
INSTANTIATE_TEST_SUITE_P(UploadCopies, SlidingVsResident, ::testing::ValuesIn(copy_cases()), case_name);

// The embedding's gradient in two parts (docs/ENGINE.md "The embedding's rows"): without clipping,
// every blob but the embedding held, the rows the step's tokens do not touch go down right after
// the head's backward on a stream of their own and are updated there (with the rows of the blob's
// padding), the touched ones at the end. Against the resident engine, byte for byte: tied
// and untied tables, bf16 and fp32 compute (rounded through the part's own staging, or copied as
// they are), bf16 state, grad-accum 2-3 (the union of the micro-batches' tokens), odd chunks
// (rows across chunk ends), upload copies, each with one stream stalled (1 compute: the lookup's
// backward must wait for the first part's reads; 4 d2h; 16 opt; 32 the first part's own stream).
std::vector<Case> rows_cases() {
  std::vector<Case> out;
  auto add = [&](const char* family, uint64_t stall, auto&& set) {
    Case c{family, 2, stall ? 50 : 0, stall};
    c.overlap = true;
    c.hold = int64_t(1) << 40;  // every host blob but the embedding
    c.rows_split = true;
    set(c);
    out.push_back(c);
  };
  add("llama", 32, [](Case& c) {  // untied, bf16, odd chunks, grad-accum 2
    c.bf16 = true;
    c.small_chunks = true;
    c.micro = 2;
  });
  add("mistral", 1, [](Case& c) { c.bf16 = true; });  // tied, compute stalled
  add("qwen3", 16, [](Case& c) {                      // tied, fp32 compute, odd chunks, grad-accum 3
    c.small_chunks = true;
    c.micro = 3;
  });
  add("gemma3", 4, [](Case& c) {  // tied, scaled embedding, bf16 state, upload copies
    c.bf16 = true;
    c.bf16_state = true;
    c.copies = true;
  });
  add("qwen2", 32, [](Case& c) {  // untied, fp32 compute, every blob but the embedding on the GPU
    c.gpu = 4;
    c.hold = 0;
  });
  add("llama", 0, [](Case& c) {  // the option off: the whole table at the end
    c.bf16 = true;
    c.rows_split = false;
    c.no_rows_split = true;
  });
  return out;
}
INSTANTIATE_TEST_SUITE_P(EmbeddingRows, SlidingVsResident, ::testing::ValuesIn(rows_cases()), case_name);

// Held updates begun as their gradient lands (docs/ENGINE.md "Held updates begun early"): without
// clipping, a share of each held blob's AdamW runs on opt as soon as its gradient has landed,
// during the backward, the rest after it. Against the resident engine, byte for byte: every host
// blob but the embedding held or only the last few, shares from 30 % to all of it (the rest
// empty), bf16 and fp32 compute, bf16 state, grad-accum 2, upload copies, blobs kept on the GPU,
// the AdamW state of some blobs on disk (those are updated whole), each with one stream stalled
// (1 compute, 4 d2h: a landing must wait for the last span's read, 16 opt, 32 the embedding's
// first part).
std::vector<Case> early_cases() {
  std::vector<Case> out;
  auto add = [&](const char* family, uint64_t stall, int early, auto&& set) {
    Case c{family, 2, stall ? 50 : 0, stall};
    c.overlap = true;
    c.hold = int64_t(1) << 40;  // every host blob but the embedding
    c.early = early;
    set(c);
    out.push_back(c);
  };
  add("llama", 16, 50, [](Case& c) {  // untied, bf16, odd chunks
    c.bf16 = true;
    c.small_chunks = true;
  });
  add("qwen3", 4, 30, [](Case& c) {  // tied, the last blobs only, grad-accum 2
    c.hold = 3000;
    c.micro = 2;
  });
  add("gemma3", 1, 100, [](Case& c) {  // all of each held update as it lands, bf16 state, copies
    c.bf16 = true;
    c.bf16_state = true;
    c.copies = true;
  });
  add("mistral", 16, 70, [](Case& c) {  // embedding, layer 1 and head on the GPU; even layers' state on disk
    c.gpu = 2;
    c.disk = 1;
    c.slots = 3;
  });
  add("qwen2", 32, 40, [](Case& c) {  // untied, bf16, the embedding's rows in two parts beside it
    c.bf16 = true;
    c.rows_split = true;
  });
  return out;
}
INSTANTIATE_TEST_SUITE_P(EarlyHeld, SlidingVsResident, ::testing::ValuesIn(early_cases()), case_name);

// A tied table larger than a layer with two slots (the planner's fallback) and with more slots than
// blobs: the head needs the table and its norm at once, the last layer's prefetch having put the
// norm in the large slot (the table's request comes first: slot_requests); every layer in a slot.
std::vector<Case> slot_count_cases() {
  std::vector<Case> out;
  for (auto [family, slots, overlap, stalls] :
       {std::tuple{"mistral", 2, false, 2}, std::tuple{"qwen3", 2, true, 3}, std::tuple{"llama", 2, true, 2},
        std::tuple{"mistral", 7, true, 1}, std::tuple{"llama", 8, false, 17}}) {
    Case c{family, slots, 40};
    c.overlap = overlap;
    c.stall_streams = uint64_t(stalls);
    c.big_vocab = true;
    out.push_back(c);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(SlotCounts, SlidingVsResident, ::testing::ValuesIn(slot_count_cases()), case_name);

// The gradients alone between steps (compute_grads: a backward without updates) with the state ring
// reading ahead into the checkpoints it frees: what was read there is dropped (its memory is the
// next forward's) and read again for the next step's updates. Both engines run the same sequence.
TEST(SlidingLending, GradientsAloneBetweenStepsKeepTheBits) {
  nlohmann::json cfg = test::tiny_config("llama");
  cfg["num_hidden_layers"] = 4;
  const ModelSpec spec = parse_model_spec(cfg, "tiny");
  const auto recs = random_records(int(spec.vocab), 21, 7);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 11;
  eo.max_micro = 2;
  std::vector<Batch> grads_batches = {make_batch({&recs[3], &recs[4]}, 11), make_batch({&recs[5], &recs[6]}, 11)};
  auto run = [&](Engine& e) {
    e.init_random(5);
    auto [l1, p1] = train(e, recs, 2, 2, 0.5);
    const double g = e.compute_grads(grads_batches);
    auto [l2, p2] = train(e, recs, 2, 2, 0.5, 3);
    l1.push_back(g);
    l1.insert(l1.end(), l2.begin(), l2.end());
    return std::make_pair(l1, p2);
  };
  auto dev_r = make_cpu_device();
  ResidentEngine r(*dev_r, spec, eo);
  const auto [lr, pr] = run(r);
  CpuDeviceOptions o;
  o.max_delay_us = 50;
  o.stall_us = 3000;
  o.stall_every = 4;
  o.stall_streams = 4;  // d2h: the reclaims
  auto dev_s = make_cpu_device(o);
  SlidingOptions so;
  so.base = eo;
  so.disk_blobs = disk_blobs(2, spec.n_layer, {});
  test::TempDir store_dir;
  so.store.dir = store_dir.path.string();
  so.store.piece = 4096;
  so.store.depth = 3;
  so.store.faults.max_delay_us = 200;
  so.store.faults.short_transfers = true;
  so.disk_ring = 2;
  so.disk_piece = StateStream::kPieceAlign;
  so.ckpt_stride_min = 24 << 10;
  SlidingEngine s(*dev_s, spec, so);
  const auto [ls, ps] = run(s);
  EXPECT_GT(s.stats().disk_state_lent, 0u);
  EXPECT_EQ(lr, ls);
  ASSERT_EQ(pr.size(), ps.size());
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_EQ(pr[i].data, ps[i].data) << pr[i].name;
}

INSTANTIATE_TEST_SUITE_P(Modes, SlidingVsResident, ::testing::ValuesIn(every_mode()), case_name);

// Selective recompute in the sliding engine (EngineOptions::whole_layers, kept_layers): layers kept
// whole skip their recompute, layers keeping attention's output skip attention in it, each
// micro-batch with its own kept buffers; the resident engine (recomputing every layer) gives the
// same bits. Dense, Gemma 3 and MoE families, clipping and updates during the backward, 1-3
// micro-batches, no blob / some / every blob kept on the GPU, f32 and bf16 compute, stalled streams
// (4 layers: some kept, some recomputed); a count above the model's layers means all of them.
std::vector<Case> kept_activation_cases() {
  auto c = [](const char* family, int slots, uint64_t stall, bool clip, int micro, int gpu, bool bf16, int whole,
              int attn) {
    Case k{family, slots, stall ? 50 : 0, stall};
    k.overlap = !clip;
    k.micro = micro;
    k.gpu = gpu;
    k.bf16 = bf16;
    k.whole = whole;
    k.attn = attn;
    return k;
  };
  std::vector<Case> v = {
      c("llama", 3, 0, true, 1, 0, false, 1, 1),     c("llama", 2, 1, false, 2, 1, false, 99, 0),
      c("qwen3", 3, 4, true, 3, 0, true, 0, 99),     c("mistral", 2, 2, true, 2, 2, false, 1, 2),
      c("qwen2", 3, 16, false, 2, 0, true, 2, 1),    c("gemma3", 2, 2, true, 2, 2, false, 1, 1),
      c("gemma3", 3, 0, false, 1, 0, true, 0, 99),   c("gemma3", 2, 8, true, 3, 0, false, 2, 2),
      c("qwen3_moe", 3, 0, true, 2, 0, false, 1, 1), c("mixtral", 2, 16, false, 1, 3, false, 99, 0),
      c("olmoe", 3, 8, true, 3, 0, true, 0, 99),     c("qwen3_moe", 2, 4, false, 3, 1, true, 1, 2),
  };
  v[4].hold = 3000;          // held gradients without clipping
  v[3].small_chunks = true;  // odd 37-element chunks and a 2-buffer ring
  return v;
}
INSTANTIATE_TEST_SUITE_P(SelectiveRecompute, SlidingVsResident, ::testing::ValuesIn(kept_activation_cases()),
                         case_name);

}  // namespace
}  // namespace sf

namespace sf {
namespace {

// check(a, b) on two engines of each kind built alike: resident, and sliding with every blob on the
// host or 2 kept on the device, each without and with upload copies (split masters in bf16
// compute, as on cuda; written with the master they copy).
void for_each_engine_pair(Device& dev, const ModelSpec& spec, const EngineOptions& eo,
                          const std::function<void(Engine&, Engine&)>& check) {
  {
    ResidentEngine a(dev, spec, eo), b(dev, spec, eo);
    check(a, b);
  }
  for (int gpu : {0, 2})
    for (bool copies : {false, true}) {
      SCOPED_TRACE("gpu blobs " + std::to_string(gpu) + (copies ? ", upload copies" : ""));
      SlidingOptions so;
      so.base = eo;
      so.gpu_blobs = gpu_blobs(gpu, spec.n_layer);
      if (copies) {
        so.base.compute_dtype = "bf16";
        so.upload_copies = copy_blobs(spec.n_layer, so.gpu_blobs, {});
      }
      SlidingEngine a(dev, spec, so), b(dev, spec, so);
      check(a, b);
    }
}

// The state tests' model (the tiny Llama), its layout and records, and their engine options.
struct StateTestModel {
  ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  ModelLayout layout = make_layout(spec);
  std::vector<Record> recs = random_records(int(spec.vocab), 23, 6);
  static EngineOptions options(DType state) {
    EngineOptions eo;
    eo.max_batch = 2;
    eo.max_seq = 11;
    eo.state_dtype = state;
    return eo;
  }
};

// Two engines holding the same state take the same next step (bit-identical on cpu).
void expect_same_next_step(Engine& a, Engine& b, const std::vector<Record>& recs) {
  auto [la, pa] = train(a, recs, 1, 1, 0.5);
  auto [lb, pb] = train(b, recs, 1, 1, 0.5);
  EXPECT_EQ(la, lb);
  for (size_t t = 0; t < pa.size(); ++t) EXPECT_EQ(pa[t].data, pb[t].data) << pa[t].name;
}

// The state tests' loop: for fp32 and bf16 optimizer state, every engine pair of
// for_each_engine_pair, `a` trained two steps (its AdamW moments not zero) and `b` initialised
// from another seed, given to check.
void for_each_trained_pair(const StateTestModel& m, const std::function<void(Engine&, Engine&)>& check) {
  for (DType state : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string("optimizer state ") + dtype_name(state));
    auto dev = make_cpu_device();
    for_each_engine_pair(*dev, m.spec, StateTestModel::options(state), [&](Engine& a, Engine& b) {
      a.init_random(7);
      train(a, m.recs, 2, 1, 0.5);
      b.init_random(8);
      check(a, b);
    });
  }
}

// write_state then read_state (saving and resuming one tensor at a time) gives the state back, and
// the engine written so continues as the one read from, for both engines and blobs on the host or
// kept on the device.
TEST(Engines, ReadAndWriteStateTensorByTensor) {
  const StateTestModel m;
  for_each_trained_pair(m, [&](Engine& a, Engine& b) {
    for (auto which : {Engine::State::Params, Engine::State::AdamM, Engine::State::AdamV}) {
      const auto ref = test::export_state(a, which);
      size_t k = 0;
      for (size_t bl = 0; bl < m.layout.blobs.size(); ++bl)
        for (size_t i = 0; i < m.layout.blobs[bl].entries.size(); ++i, ++k)
          b.write_state(which, int(bl), int(i), ref[k].data.data());
      const auto got = test::export_state(b, which);
      for (size_t t = 0; t < ref.size(); ++t) EXPECT_EQ(got[t].data, ref[t].data) << ref[t].name;
    }
    expect_same_next_step(a, b, m.recs);
  });
}

// read_state of the two engines (device buffers in one, host state and kept blobs in the other)
// agrees tensor by tensor after the same training (the engines are bit-identical on cpu); bf16
// moments read back as fp32 are bf16 values.
TEST(Engines, ReadStateAgreesBetweenEngines) {
  const StateTestModel m;
  for (DType state : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string("optimizer state ") + dtype_name(state));
    const EngineOptions eo = StateTestModel::options(state);
    auto dev = make_cpu_device();
    for (int gpu : {0, 2}) {
      SCOPED_TRACE("against the resident engine, gpu blobs " + std::to_string(gpu));
      ResidentEngine r(*dev, m.spec, eo);
      SlidingOptions so;
      so.base = eo;
      so.gpu_blobs = gpu_blobs(gpu, m.spec.n_layer);
      SlidingEngine sl(*dev, m.spec, so);
      r.init_random(7);
      sl.init_random(7);
      train(r, m.recs, 2, 1, 0.5);
      train(sl, m.recs, 2, 1, 0.5);
      for (const test::SavedTensor& t : test::saved_tensors(m.layout)) {
        std::vector<float> x(size_t(t.e->numel)), y(x.size(), -1.f);
        r.read_state(t.which, t.blob, t.entry, x.data());
        sl.read_state(t.which, t.blob, t.entry, y.data());
        ASSERT_EQ(x, y) << t.e->name;
        if (state == DType::BF16 && t.which != Engine::State::Params) {
          for (float f : y) ASSERT_EQ(f, test::round_bf16(f)) << t.e->name;
        }
      }
    }
  }
}

// Saving and resuming a large tensor go a part at a time (read_state_part / write_state_part,
// kStatePart): parts of odd sizes give the whole tensors' values, and an engine written part by part
// holds the same state and takes the same next step, for both engines and blobs on the host, kept
// on the device, with upload copies (split masters) and with bf16 moments; parts outside a tensor
// are refused.
TEST(Engines, StateInPartsIsTheWholeTensors) {
  const StateTestModel m;
  for_each_trained_pair(m, [&](Engine& a, Engine& b) {
    ASSERT_NO_FATAL_FAILURE(test::copy_saved_state_in_parts(a, b, m.layout, 7, 5));
    for (auto which : {Engine::State::Params, Engine::State::AdamM, Engine::State::AdamV}) {
      const auto ref = test::export_state(a, which), got = test::export_state(b, which);
      for (size_t t = 0; t < ref.size(); ++t) EXPECT_EQ(got[t].data, ref[t].data) << ref[t].name;
    }
    expect_same_next_step(a, b, m.recs);
    std::vector<float> x(8);
    const int64_t n0 = m.layout.blobs[0].entries[0].numel;
    EXPECT_THROW(a.read_state_part(Engine::State::Params, 0, 0, n0 - 2, 3, x.data()), std::runtime_error);
    EXPECT_THROW(b.write_state_part(Engine::State::AdamM, 0, 0, -1, 2, x.data()), std::runtime_error);
  });
}

// SF_TRACE: every stream's marks of every step, in time order, each step's compute marks in
// schedule order, and the split update's passes on the opt stream (parameters before moments).
TEST(SlidingEngine, TraceRecordsTheTimelineOfEachStep) {
  nlohmann::json cfg = test::tiny_config("llama");
  ModelSpec spec = parse_model_spec(cfg, "tiny");
  auto recs = random_records(int(spec.vocab), 29, 6);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 11;
  test::TempDir dir;
  const std::string path = (dir.path / "trace.jsonl").string();
  ::setenv("SF_TRACE", path.c_str(), 1);
  {
    auto dev = make_cpu_device();
    SlidingOptions so;
    so.base = eo;
    SlidingEngine e(*dev, spec, so);
    e.init_random(3);
    train(e, recs, 2, 1, 0.5);
  }
  ::unsetenv("SF_TRACE");
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> marks;
  while (std::getline(in, line)) marks.push_back(nlohmann::json::parse(line));
  ASSERT_FALSE(marks.empty());
  double last = -1;
  int runs = 0, heads = 0, params = 0, moments = 0;
  std::vector<std::string> compute;
  for (const auto& m : marks) {
    EXPECT_GE(m["t"].get<double>(), last);
    last = m["t"].get<double>();
    const std::string st = m["stream"], what = m["what"];
    runs += st == "host" && what == "run";
    heads += st == "compute" && what == "head";
    if (st == "compute") compute.push_back(what);
    if (st == "opt" && what.rfind("updated ", 0) == 0) {
      const bool is_m = what.find("moments") != std::string::npos;
      moments += is_m;
      params += !is_m;
      if (is_m) {
        EXPECT_EQ(params % (spec.n_layer + 2), 0) << "a moment pass before the step's parameter passes";
      }
    }
  }
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(heads, 2);
  EXPECT_EQ(params, 2 * (spec.n_layer + 2));
  EXPECT_EQ(moments, 2 * (spec.n_layer + 2));
  // One step's compute marks: forward 0..L, head, backward L..0.
  std::vector<std::string> want;
  for (int l = 0; l <= spec.n_layer; ++l) want.push_back("forward " + std::to_string(l));
  want.push_back("head");
  for (int l = spec.n_layer; l >= 0; --l) want.push_back("backward " + std::to_string(l));
  ASSERT_GE(compute.size(), want.size());
  EXPECT_EQ(std::vector<std::string>(compute.begin(), compute.begin() + long(want.size())), want);
}

}  // namespace
// The planner counts a step's uploads by replaying the slot policy over the schedule
// (SlidingEngine::pass_uploads); the engine's own count must be the same, blob for blob in bytes,
// for every slot count up to more than the model's blobs: tied and untied heads, an embedding
// larger than a layer (real models) and smaller (tiny ones), blobs kept on the GPU, clipping or
// not, held gradients, micro-batches, upload copies.
TEST(SlidingEngine, UploadsAreTheSlotPolicyReplayed) {
  for (auto [tie, vocab, kept, clip, hold, micro, copies] :
       {std::tuple{true, 400, 0, 0.0, 0, 1, false}, std::tuple{false, 400, 0, 1.0, 0, 2, false},
        std::tuple{true, 37, 0, 1.0, 0, 1, true}, std::tuple{false, 37, 2, 0.0, 6000, 1, false},
        std::tuple{true, 400, 2, 0.0, 0, 2, true}, std::tuple{false, 400, 3, 1.0, 0, 1, false},
        std::tuple{true, 400, 1, 0.0, 20000, 1, false}}) {
    nlohmann::json cfg = test::tiny_config("llama");
    cfg["num_hidden_layers"] = 5;
    cfg["tie_word_embeddings"] = tie;
    cfg["vocab_size"] = vocab;
    const ModelSpec spec = parse_model_spec(cfg, "tiny");
    const ModelLayout layout = make_layout(spec);
    const auto recs = random_records(int(spec.vocab), 21, 7);
    const std::vector<int> order = gpu_blob_order(spec);
    for (int slots = 2; slots <= spec.n_layer + 4; ++slots) {
      const std::string what = std::string(tie ? "tied" : "untied") + ", vocab " + std::to_string(vocab) + ", " +
                               std::to_string(kept) + " kept, clip " + std::to_string(clip) + ", hold " +
                               std::to_string(hold) + ", " + std::to_string(micro) + " micro-batches, " +
                               std::to_string(slots) + " slots";
      SCOPED_TRACE(what);
      SlidingOptions so;
      so.base.max_batch = 2;
      so.base.max_seq = 11;
      so.base.max_micro = micro;
      so.slots = slots;
      so.keep_grads = clip > 0;
      so.hold_grads = hold;
      so.gpu_blobs.assign(order.begin(), order.begin() + kept);
      if (copies)
        for (int b = 0; b < int(layout.blobs.size()); ++b)
          if (std::find(so.gpu_blobs.begin(), so.gpu_blobs.end(), b) == so.gpu_blobs.end())
            so.upload_copies.push_back(b);
      auto dev = make_cpu_device();
      SlidingEngine e(*dev, spec, so);
      e.init_random(5);
      train(e, recs, 1, micro, clip);
      const auto before = e.stats();
      train(e, recs, 1, micro, clip, 2);
      const auto after = e.stats();
      const auto ups = SlidingEngine::pass_uploads(spec, layout, so);
      uint64_t bytes = 0;
      for (const auto& u : ups) bytes += uint64_t(layout.blobs[size_t(u.blob)].numel) * 4;  // fp32 (cpu compute)
      EXPECT_EQ(after.uploads - before.uploads, int64_t(ups.size()));
      EXPECT_EQ(after.uploaded_bytes - before.uploaded_bytes, bytes);
    }
  }
}

}  // namespace sf

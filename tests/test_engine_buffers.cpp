// Each engine allocates exactly the buffers of its list (engine/buffers.h), which the planner sums:
// counted where the memory is handed out, by a Device that forwards to the cpu device and counts
// the live bytes of each kind, for both engines in many configurations.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/kept_activations.h"
#include "engine/planner.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "engine/state_stream.h"
#include "engine/token_uploader.h"
#include "io/nvme_store.h"
#include "model/program.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

// The planner's options for a placement (planner.cpp's fill): defaults but the shape, the
// micro-batches and the state dtype. The engines below are built from a Plan's placement through
// sliding_options, as make_engine builds them.
EngineOptions planner_base(int B, int T, int micro, DType state) {
  EngineOptions o;
  o.max_batch = B;
  o.max_seq = T;
  o.max_micro = micro;
  o.state_dtype = state;
  return o;
}

// The cpu device, counting the bytes of device memory and of page-locked memory now allocated.
class CountingDevice final : public Device {
 public:
  explicit CountingDevice(Device& d) : d_(d) {}
  size_t device = 0, pinned = 0;

  std::string name() const override { return d_.name(); }
  bool is_host() const override { return d_.is_host(); }
  void* alloc(size_t bytes) override { return note(d_.alloc(bytes), bytes, device); }
  void free(void* p) override {
    forget(p, device);
    d_.free(p);
  }
  void* alloc_pinned(size_t bytes) override { return note(d_.alloc_pinned(bytes), bytes, pinned); }
  void free_pinned(void* p) override {
    forget(p, pinned);
    d_.free_pinned(p);
  }
  std::unique_ptr<Stream> create_stream() override { return d_.create_stream(); }
  std::unique_ptr<Event> create_event() override { return d_.create_event(); }
  void record(Event& e, Stream& s) override { d_.record(e, s); }
  void wait(Stream& s, Event& e) override { d_.wait(s, e); }
  void synchronize(Event& e) override { d_.synchronize(e); }
  void synchronize(Stream& s) override { d_.synchronize(s); }
  bool query(Event& e) override { return d_.query(e); }
  std::unique_ptr<Event> create_timing_event() override { return d_.create_timing_event(); }
  double elapsed_seconds(Event& from, Event& to) override { return d_.elapsed_seconds(from, to); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) override {
    d_.copy(dst, src, bytes, kind, s);
  }
  void host_fn(Stream& s, std::function<void()> fn) override { d_.host_fn(s, std::move(fn)); }
  Ops& ops() override { return d_.ops(); }

 private:
  void* note(void* p, size_t bytes, size_t& counter) {
    live_[p] = bytes;
    counter += bytes;
    return p;
  }
  void forget(void* p, size_t& counter) {
    const auto it = live_.find(p);
    ASSERT_NE(it, live_.end());
    counter -= it->second;
    live_.erase(it);
  }
  Device& d_;
  std::map<void*, size_t> live_;
};

ModelSpec tiny_spec(const std::string& family) { return parse_model_spec(test::tiny_config(family), "tiny"); }

// The cpu backend's sizes for the engines' lists (bf16: the engine's --compute-dtype bf16).
BackendSizes cpu_sizes(const ModelSpec& s, int B, int T, bool bf16) {
  const DType act = bf16 ? DType::BF16 : DType::F32;
  const BatchDims d{B, T, {}};
  return BackendSizes{act,
                      Workspace::bytes_for(s, B, T, act, cpu::attention_workspace_bytes(attn_dims(s, d)),
                                           cpu::linear_ce_workspace_bytes(d.N(), s.hidden, s.vocab)),
                      0};
}

BackendInfo cpu_info(bool bf16) {
  BackendInfo be = backend_info("cpu");
  if (bf16) be.compute_dtype = DType::BF16;
  return be;
}

// Bytes of the resident engine's AdamW m and v items.
size_t moment_bytes(const MemoryItems& list) {
  size_t n = 0;
  for (const MemoryItem& m : list)
    if (m.key == "m" || m.key == "v") n += m.bytes * size_t(m.count);
  return n;
}

TEST(EngineBuffers, ResidentAllocatesItsList) {
  auto cpu = make_cpu_device();
  for (const bool bf16 : {false, true})
    for (const std::string family : {"llama", "mistral", "qwen3"})
      for (auto [B, T] : {std::pair{1, 1}, std::pair{3, 40}})
        for (auto [training, optimizer, micro] : {std::tuple{true, true, 1}, std::tuple{true, false, 1},
                                                  std::tuple{false, false, 1}, std::tuple{true, true, 3}})
          for (auto [whole_of, kept_of] :
               {std::pair{0, 0}, std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 0}, std::pair{2, 0}, std::pair{1, 1}}) {
            // selective recompute: layers kept whole, layers keeping attention (none, one, all)
            const ModelSpec spec = tiny_spec(family);
            const int kept = kept_of == 2 ? spec.n_layer : kept_of, whole = whole_of == 2 ? spec.n_layer : whole_of;
            EngineOptions o;
            o.whole_layers = whole;
            o.kept_layers = kept;
            o.max_batch = B;
            o.max_seq = T;
            o.max_micro = micro;
            o.training = training;
            o.optimizer = optimizer;
            if (bf16) o.compute_dtype = "bf16";
            // bf16 optimizer state (m and v 2 bytes each) in the larger shape, with either compute dtype
            const DType state = B == 3 ? DType::BF16 : DType::F32;
            o.state_dtype = state;
            SCOPED_TRACE(family + " " + std::to_string(B) + "x" + std::to_string(T) + (bf16 ? " bf16" : " f32") +
                         " state " + dtype_name(state) + " training " + std::to_string(training) + " optimizer " +
                         std::to_string(optimizer) + " micro " + std::to_string(micro) + " kept " +
                         std::to_string(kept) + " whole " + std::to_string(whole));
            CountingDevice dev(*cpu);
            {
              ResidentEngine e(dev, spec, o);
              const MemoryItems list = ResidentEngine::buffers(spec, o, cpu_sizes(spec, B, T, bf16));
              EXPECT_EQ(dev.device, total_bytes(list, Place::Device));
              EXPECT_EQ(dev.pinned, total_bytes(list, Place::Pinned));
              EXPECT_EQ(total_bytes(list, Place::Host), 0u);
              // The planner's lines are the same list, merged by name.
              const MemoryItems plan = resident_memory(spec, o, cpu_info(bf16));
              // The kept attention outputs: kept layers' [N, Q] act + [N * n_head] F32, only when training.
              const MemoryItems kept_items = items_with(list, "kept");
              const size_t kept_bytes = training ? size_t(kept) * KeptActivations::attention_bytes(
                                                                      spec, B, T, bf16 ? DType::BF16 : DType::F32)
                                                 : 0;
              EXPECT_EQ(total_bytes(kept_items, Place::Device), kept_bytes);
              const size_t whole_bytes =
                  training ? size_t(whole) * Workspace::forward_bytes_for(spec, B, T, bf16 ? DType::BF16 : DType::F32)
                           : 0;
              EXPECT_EQ(total_bytes(items_with(list, "whole"), Place::Device), whole_bytes);
              if (kept > 0 && training) {
                EXPECT_GE(kept_bytes, size_t(kept) * size_t(B * T) *
                                          (size_t(spec.q_dim()) * (bf16 ? 2 : 4) + size_t(spec.n_head) * 4));
              }
              if (optimizer && training) {  // the moments: 2 x 4 or 2 x 2 bytes a parameter
                EXPECT_EQ(moment_bytes(list), size_t(make_layout(spec).total_numel()) * 2 * dtype_size(state));
              }
              EXPECT_EQ(total_bytes(plan, Place::Device), dev.device);
              EXPECT_EQ(total_bytes(plan, Place::Pinned), dev.pinned);
            }
            EXPECT_EQ(dev.device + dev.pinned, 0u);  // everything freed
          }
}

TEST(EngineBuffers, SlidingAllocatesItsList) {
  auto cpu = make_cpu_device();
  for (const bool bf16 : {false, true})
    for (const std::string family : {"llama", "qwen3"}) {
      const ModelSpec spec = tiny_spec(family);
      const std::vector<int> order = gpu_blob_order(spec);
      for (auto [B, T] : {std::pair{1, 1}, std::pair{2, 11}})
        for (int slots : {2, 3})
          for (size_t kept : {size_t(0), size_t(1), size_t(3), order.size()})
            for (auto [micro, keep, hold, chunk] :
                 {std::tuple{1, true, 0, 0}, std::tuple{3, false, 0, 0}, std::tuple{2, false, 5000, 0},
                  std::tuple{2, true, 0, 37}, std::tuple{1, false, 0, 37}}) {
              const DType state = B == 2 ? DType::BF16 : DType::F32;  // bf16 optimizer state in the larger shape
              Plan pl;
              pl.slots = slots;
              pl.hold_grads = hold;
              pl.gpu_blobs.assign(order.begin(), order.begin() + ptrdiff_t(kept));
              // Selective recompute (per micro-batch): a layer kept whole in half the configurations,
              // one keeping attention's output with 3 slots.
              pl.whole_layers = kept % 2 == 1 ? 1 : 0;
              pl.kept_layers = slots == 3 ? 1 : 0;
              // Upload copies of every host blob with 2 slots ("host.work", pinned).
              for (size_t b = kept; slots == 2 && b < order.size(); ++b) pl.upload_copies.push_back(order[b]);
              EngineOptions base = planner_base(B, T, micro, state);
              if (bf16) base.compute_dtype = "bf16";
              SlidingOptions so = sliding_options(pl, base, keep);
              if (chunk) {  // odd chunks through a 2-buffer ring (the engine tests' small configuration)
                so.chunk = chunk;
                so.grad_ring = 2;
              }
              SCOPED_TRACE(family + " " + std::to_string(B) + "x" + std::to_string(T) + (bf16 ? " bf16 " : " f32 ") +
                           std::to_string(slots) + " slots, " + std::to_string(kept) + " kept, " +
                           std::to_string(micro) + " micro-batches, keep_grads " + std::to_string(keep) + ", hold " +
                           std::to_string(hold) + ", chunk " + std::to_string(chunk) + ", state " + dtype_name(state));
              CountingDevice dev(*cpu);
              {
                SlidingEngine e(dev, spec, so);
                const MemoryItems list = SlidingEngine::buffers(spec, so, cpu_sizes(spec, B, T, bf16));
                EXPECT_EQ(dev.device, total_bytes(list, Place::Device));
                EXPECT_EQ(dev.pinned, total_bytes(list, Place::Pinned));
                EXPECT_EQ(e.host_bytes() - e.stats().pinned_bytes, total_bytes(list, Place::Host));  // AdamW m, v
                EXPECT_EQ(e.device_bytes(),
                          total_bytes(list, Place::Device) - cpu_sizes(spec, B, T, bf16).stream_scratch);
                const DType act = bf16 ? DType::BF16 : DType::F32;
                EXPECT_EQ(total_bytes(items_with(list, "whole"), Place::Device),
                          size_t(micro * pl.whole_layers) * KeptActivations::whole_bytes(spec, B, T, act));
                EXPECT_EQ(total_bytes(items_with(list, "kept"), Place::Device),
                          size_t(micro * pl.kept_layers) * KeptActivations::attention_bytes(spec, B, T, act));
                size_t copies = 0;
                for (int b : pl.upload_copies)
                  copies += size_t(make_layout(spec).blobs[size_t(b)].numel) * dtype_size(act);
                EXPECT_EQ(total_bytes(items_with(list, "host.work"), Place::Pinned), copies);
                // bf16 copies: split masters (their low halves pageable, as many bytes as the copies).
                EXPECT_EQ(total_bytes(items_with(list, "host.lo"), Place::Host), bf16 ? copies : 0u);
                if (!chunk) {  // the planner plans the default chunk and ring
                  const MemoryItems plan =
                      sliding_memory(spec, sliding_options(pl, planner_base(B, T, micro, state), keep), cpu_info(bf16));
                  EXPECT_EQ(total_bytes(plan, Place::Device), dev.device);
                  EXPECT_EQ(total_bytes(plan, Place::Pinned), dev.pinned);
                  EXPECT_EQ(total_bytes(plan, Place::Host), total_bytes(list, Place::Host));
                }
              }
              EXPECT_EQ(dev.device + dev.pinned, 0u);
            }
    }
}

// Checkpoints in the offload file through cuFile (GPUDirect Storage, chosen at start-up) need no
// pinned ring: the planner, told the choice (PlanRequest::ckpt_cufile), counts what the engine
// allocates, with the bounce path (the ring counted) and with cuFile (the test stand-in).
TEST(EngineBuffers, PlannedCheckpointIoIsWhatTheEngineAllocates) {
  auto cpu = make_cpu_device();
  const ModelSpec spec = tiny_spec("llama");
  size_t pinned_bounce = 0, pinned_cufile = 0;
  for (const std::string& cufile : {std::string(), std::string(SF_FAKE_CUFILE)}) {
    SCOPED_TRACE(cufile.empty() ? "pinned bounce" : "cuFile");
    test::TempDir dir;
    Plan pl;
    pl.slots = 2;
    pl.ckpt_disk_layers = 2;
    pl.ckpt_cufile = cufile;
    SlidingOptions so = sliding_options(pl, planner_base(2, 11, 2, DType::F32), true);
    so.store.dir = dir.path.string();
    so.store.direct = cufile.empty();  // the stand-in's pread/pwrite take any buffer
    CountingDevice dev(*cpu);
    {
      SlidingEngine e(dev, spec, so);
      const MemoryItems plan =
          sliding_memory(spec, sliding_options(pl, planner_base(2, 11, 2, DType::F32), true), cpu_info(false));
      EXPECT_EQ(total_bytes(plan, Place::Device), dev.device);
      EXPECT_EQ(total_bytes(plan, Place::Pinned), dev.pinned);
      (cufile.empty() ? pinned_bounce : pinned_cufile) = dev.pinned;
    }
    EXPECT_EQ(dev.device + dev.pinned, 0u);
  }
  // The ring: 2 write buffers and 4 reads ahead, each one checkpoint (a block-aligned [2 x 11, H]
  // fp32), and its alignment.
  EXPECT_GT(pinned_bounce, pinned_cufile);
  const size_t ckpt = size_t(NvmeStore::aligned(size_t(2 * 11 * spec.hidden) * 4));
  EXPECT_GE(pinned_bounce - pinned_cufile, 6 * ckpt);
}

// The AdamW state ring of the NVMe tier holds `disk_ring` pieces, not whole blobs: what the engine
// allocates is its list, which the planner sums (the default piece, the chunk), at every level of
// the tier; with pieces smaller than a blob the ring is smaller than one blob's region. So does
// the ring of working copies read for the uploads at level 5 (pieces of the same size).
TEST(EngineBuffers, StateRingIsPiecesAsPlanned) {
  auto cpu = make_cpu_device();
  const ModelSpec spec = tiny_spec("llama");
  const int64_t layer = make_layout(spec).blobs[1].numel;
  for (int level : {2, 4, 5})
    for (int64_t piece : {int64_t(0), StateStream::kPieceAlign}) {
      SCOPED_TRACE("level " + std::to_string(level) + ", piece " + std::to_string(piece));
      test::TempDir dir;
      Plan pl;
      pl.slots = 2;
      for (int b = 1; b <= spec.n_layer; ++b) pl.disk_blobs.push_back(b);
      if (level >= 4) pl.disk_masters = pl.disk_blobs;
      if (level >= 5) pl.disk_weights = pl.disk_grads = pl.disk_blobs;
      if (level == 4) pl.upload_copies = {0, spec.n_layer + 1};  // beside the disk masters' working copies
      EngineOptions base = planner_base(2, 11, 1, DType::F32);
      base.compute_dtype = "bf16";
      SlidingOptions so = sliding_options(pl, base, true);
      so.disk_piece = piece;
      so.disk_ring = 2;
      so.store.dir = dir.path.string();
      CountingDevice dev(*cpu);
      {
        SlidingEngine e(dev, spec, so);
        const MemoryItems list = SlidingEngine::buffers(spec, so, cpu_sizes(spec, 2, 11, true));
        EXPECT_EQ(dev.pinned, total_bytes(list, Place::Pinned));
        EXPECT_EQ(e.host_bytes() - e.stats().pinned_bytes, total_bytes(list, Place::Host));
        size_t ring = 0, wring = 0;
        for (const MemoryItem& m : list) {
          if (m.key == "disk.ring") ring = m.bytes;
          if (m.key == "disk.wring") wring = m.bytes;
        }
        // Level 5: the working copies' pinned ring, 2 pieces (bf16), fewer bytes than the two
        // whole working copies it held before.
        EXPECT_EQ(wring > 0, level >= 5);
        if (level >= 5 && piece > 0) {
          EXPECT_EQ(wring, 2 * size_t(NvmeStore::aligned(uint64_t(piece) * 2)) + NvmeStore::kAlign);
          EXPECT_LT(wring, 2 * size_t(layer) * 2);
        }
        // grad 2 + m 4 + v 4 + master 4 + working copy 2 bytes an element at most
        if (piece > 0) {
          ASSERT_LT(piece, layer);  // several pieces a layer
          EXPECT_LE(ring, size_t(so.disk_ring) * size_t(piece) * 16 + NvmeStore::kAlign);
          EXPECT_LT(ring, size_t(so.disk_ring) * size_t(layer) * 8);  // less than the layers' m and v alone
        } else {                                                      // the planner's lines: the default piece
          const MemoryItems plan =
              sliding_memory(spec, sliding_options(pl, planner_base(2, 11, 1, DType::F32), true), cpu_info(true));
          EXPECT_EQ(total_bytes(plan, Place::Host), total_bytes(list, Place::Host));
          EXPECT_EQ(total_bytes(plan, Place::Pinned), dev.pinned);
          EXPECT_EQ(total_bytes(plan, Place::Disk), total_bytes(list, Place::Disk));
        }
      }
      EXPECT_EQ(dev.device + dev.pinned, 0u);
    }
}

// A list's item that nobody allocates, or an allocation that is not listed, stops the constructor.
TEST(EngineBuffers, SourceChecksTheList) {
  auto cpu = make_cpu_device();
  EXPECT_THROW(
      {
        BufferSource src(*cpu, {{"a", 256, Place::Device, "a"}, {"b", 256, Place::Pinned, "b"}});
        DeviceBuffer a = src.buffer("a");
      },
      std::exception);
  EXPECT_THROW(
      {
        BufferSource src(*cpu, {{"a", 256, Place::Device, "a"}});
        DeviceBuffer a = src.buffer("a");
        DeviceBuffer b = src.buffer("a");
      },
      std::exception);
  BufferSource src(*cpu, {{"a", 256, Place::Device, "a"}, {"scratch", 64, Place::Device}});
  EXPECT_EQ(src.buffer("a").size(), 256u);
  EXPECT_FALSE(src.has("a"));
  EXPECT_EQ(src.buffer_if("b").size(), 0u);
  // An item of count n: n buffers of its bytes, taken n times (no fewer).
  EXPECT_THROW(
      {
        BufferSource c(*cpu, {{"t", 256, Place::Device, "t", 3}});
        DeviceBuffer a = c.buffer("t");
        DeviceBuffer b = c.buffer("t");
      },
      std::exception);
  BufferSource c(*cpu, {{"t", 256, Place::Device, "t", 2}});
  EXPECT_EQ(c.buffer("t").size(), 256u);
  EXPECT_TRUE(c.has("t"));
  EXPECT_EQ(c.buffer("t").size(), 256u);
  EXPECT_FALSE(c.has("t"));
}

// The planner lists engines for --grad-accum values it then refuses (tests/test_input_hardening.cpp
// asks for 100,000,000): the token buffers, 2 a micro-batch, are one item with a count, so the list
// stays short and its bytes exact (a list of 2e8 items took 110 s and 2.5 GB to build).
TEST(EngineBuffers, ManyMicroBatchesAreOneItemWithACount) {
  const MemoryItems m = TokenUploader::buffers({16, 200000000});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(total_bytes(m, Place::Device), size_t(200000000) * 16 * TokenUploader::kBytesPerToken);
  EXPECT_EQ(total_bytes(m, Place::Pinned), size_t(200000000) * 16 * TokenUploader::kBytesPerToken);
  const MemoryItems merged = merge_by_name(m);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].bytes, size_t(200000000) * 16 * TokenUploader::kBytesPerToken);
  EXPECT_EQ(merged[0].count, 1u);
}

}  // namespace
}  // namespace sf

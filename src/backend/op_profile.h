// Where a step's GPU time goes, op by op (`bench --profile-ops`): a Device that forwards
// everything to another and hands out a kernel table that records a timing event pair around
// every call. Each call is counted with the FLOPs and the fewest device bytes it must move (each
// input read once, each output written once), so the table sets each op's time against its floor
// max(FLOPs / matrix peak, bytes / memory bandwidth). Diagnostics only: two events a call, and the
// host waits for them when collecting; never on unless asked for.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/device.h"

namespace sf {

// The ceilings the table measures against. Defaults: the H200 of the GPU machine, as measured there
// (docs/PERFORMANCE.md: cuBLASLt bf16 GEMM 764 TFLOP/s from `plan --measure`; device copy 4.19 TB/s,
// the RMSNorm kernels' reference).
struct OpCeilings {
  double matrix_flops = 764e12;  // FLOP/s
  double memory_bytes = 4.19e12;  // bytes/s, read + written
};

// One row of the table: an op of one shape class (matmuls by M, N, K, transposes and output).
struct OpRow {
  std::string key;
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0;
  int stream = 0;  // index of the first stream it ran on (0: the first stream seen, the compute one)
  double floor_seconds(const OpCeilings& c) const;
};

// What ProfiledDevice's table records: FLOPs and bytes an op must do, counted from its tensors.
struct OpCount {
  double flops = 0, bytes = 0;
};

class ProfiledDevice final : public Device {
 public:
  explicit ProfiledDevice(std::unique_ptr<Device> inner);
  ~ProfiledDevice() override;

  // Waits for every recorded pair and adds its time to the rows; then the events are reused.
  void collect();
  // Drops what was recorded so far (warm-up steps): collect, then clear the rows.
  void reset();
  // The rows, the largest total first.
  std::vector<OpRow> rows() const;
  // Sum of the op times per stream, in seconds (index as OpRow::stream).
  std::vector<double> stream_seconds() const;

  // The table as text (one line a row, `top` rows then the rest summed) and as JSON, for `steps`
  // steps of `step_seconds` each.
  std::string table(const OpCeilings& c, int64_t steps, double step_seconds, size_t top = 40) const;
  nlohmann::json json(const OpCeilings& c, int64_t steps, double step_seconds) const;

  // Device: everything forwards to the inner device; ops() is the recording table.
  std::string name() const override { return inner_->name(); }
  bool is_host() const override { return inner_->is_host(); }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) override { inner_->free(p); }
  void* alloc_pinned(size_t bytes) override { return inner_->alloc_pinned(bytes); }
  void free_pinned(void* p) override { inner_->free_pinned(p); }
  std::unique_ptr<Stream> create_stream() override { return inner_->create_stream(); }
  std::unique_ptr<Event> create_event() override { return inner_->create_event(); }
  void record(Event& e, Stream& s) override { inner_->record(e, s); }
  void wait(Stream& s, Event& e) override { inner_->wait(s, e); }
  void synchronize(Event& e) override { inner_->synchronize(e); }
  void synchronize(Stream& s) override { inner_->synchronize(s); }
  bool query(Event& e) override { return inner_->query(e); }
  std::unique_ptr<Event> create_timing_event() override { return inner_->create_timing_event(); }
  double elapsed_seconds(Event& from, Event& to) override { return inner_->elapsed_seconds(from, to); }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) override {
    inner_->copy(dst, src, bytes, kind, s);
  }
  void host_fn(Stream& s, std::function<void()> fn) override { inner_->host_fn(s, std::move(fn)); }
  Ops& ops() override;

  // Called by the recording table around each op.
  size_t begin(Stream& s);
  void end(size_t rec, Stream& s, std::string key, OpCount n);

 private:
  struct Rec {
    size_t start = 0, stop = 0;  // indices into pool_
    int row = -1, stream = 0;
  };
  Event& event_at(size_t i);

  std::unique_ptr<Device> inner_;
  std::unique_ptr<Ops> table_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Event>> pool_;  // timing events, reused after each collect
  size_t next_ = 0;                           // first free event of pool_
  std::vector<Rec> recs_;                     // pairs recorded since the last collect
  std::vector<OpRow> rows_;
  std::unordered_map<std::string, int> row_of_;
  std::vector<const Stream*> streams_;
  std::vector<double> stream_s_;
};

}  // namespace sf

#include "engine/planner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/align.h"
#include "core/env.h"
#include "core/error.h"
#include "core/units.h"
#include "engine/engine.h"
#include "engine/host_optimizer.h"
#include "engine/sliding_engine.h"
#include "engine/slot_cache.h"
#include "engine/token_uploader.h"
#include "model/layout.h"
#include "model/program.h"

namespace sf {

namespace {

// Sizes shared by both engines.
struct Common {
  int64_t total = 0, max_blob = 0, max_layer_blob = 0, emb = 0, head = 0;  // of the host blobs
  int64_t gpu_total = 0;                                                   // of the GPU blobs
  size_t act = 0;                                                          // bytes of the compute dtype
  size_t stride_nh = 0;                                                    // one [max N, H] activation, 256-aligned
  int64_t max_tokens = 0;
  size_t rope = 0, workspace = 0;
  size_t blobs = 0;  // all of them
};

Common common(const ModelSpec& s, int B, int T, const BackendInfo& be, const std::vector<int>& gpu_blobs = {}) {
  Common c;
  const ModelLayout lay = make_layout(s);
  c.blobs = lay.blobs.size();
  std::vector<bool> on_gpu(lay.blobs.size(), false);
  for (int b : gpu_blobs) on_gpu.at(size_t(b)) = true;
  for (size_t i = 0; i < lay.blobs.size(); ++i) {
    const BlobLayout& b = lay.blobs[i];
    if (on_gpu[i]) {
      c.gpu_total += b.numel;
      continue;
    }
    c.total += b.numel;
    c.max_blob = std::max(c.max_blob, b.numel);
    if (b.kind == BlobKind::Layer) c.max_layer_blob = std::max(c.max_layer_blob, b.numel);
  }
  c.emb = on_gpu.front() ? 0 : lay.embedding().numel;
  c.head = on_gpu.back() ? 0 : lay.head().numel;
  c.act = dtype_size(be.compute_dtype);
  c.max_tokens = int64_t(B) * T;
  c.stride_nh = round256(size_t(c.max_tokens * s.hidden) * c.act);
  c.rope = 2 * size_t(T) * size_t(s.head_dim / 2) * 4;
  const BatchDims d{B, T, {}};
  c.workspace = Workspace::bytes_for(s, B, T, be.compute_dtype, be.attention_ws(attn_dims(s, d)),
                                     be.linear_ce_ws(d.N(), s.hidden, s.vocab));
  return c;
}

double host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return double(kb) * 1024.0;
  return 0;
}

// FLOPs per trained token of one training step (forward, recompute of the decoder layers,
// backward): matrix products (2 per multiply-add) and causal attention (FlashAttention's count).
struct Flops {
  double total = 0, forward = 0;
  double head = 0;  // of total: the head's forward and backward (the lm-head products)
};
Flops flops_per_token(const ModelSpec& s, int T) {
  const double H = double(s.hidden), Q = double(s.q_dim()), KV = double(s.kv_dim()), I = double(s.intermediate);
  const double Pd = double(s.n_layer) * (H * Q + 2 * H * KV + Q * H + 3 * H * I);
  const double Ph = double(s.vocab) * H;
  const double attn_fwd = 2.0 * double(T) * Q * double(s.n_layer);  // QK^T and PV over T/2 keys on average
  Flops f;
  f.forward = 2 * Pd + 2 * Ph + attn_fwd;
  f.total = 8 * Pd + 6 * Ph + 4.5 * attn_fwd;  // + recompute (2 Pd, 1x attention) + backward (4 Pd + 4 Ph, 2.5x)
  f.head = 6 * Ph;
  return f;
}

}  // namespace

size_t total_bytes(const std::vector<MemoryItem>& items, Place where) {
  size_t n = 0;
  for (const MemoryItem& m : items)
    if (m.place == where) n += m.bytes;
  return n;
}

const char* engine_name(EngineKind k) { return k == EngineKind::Sliding ? "sliding" : "resident"; }

std::string Shortfall::text() const {
  switch (memory) {
    case Memory::Gpu:
      return "needs " + format_bytes(needs) + " of GPU memory, " + format_bytes(available) +
             " available (--gpu-memory)";
    case Memory::Host:
      return "needs " + format_bytes(needs) + " of host memory (" + format_bytes(pinned) + " pinned), " +
             format_bytes(available) + " available (--cpu-memory)";
    case Memory::None:
      break;
  }
  return "";
}

std::vector<MemoryItem> resident_memory(const ModelSpec& s, int B, int T, const BackendInfo& be, bool training,
                                        bool optimizer, int micro) {
  const Common c = common(s, B, T, be);
  const size_t P = size_t(c.total);
  std::vector<MemoryItem> m = {{"fp32 master weights", P * 4, Place::Device}};
  if (be.compute_dtype != DType::F32) m.push_back({"compute copy of the weights", P * c.act, Place::Device});
  if (training) m.push_back({"fp32 gradients", P * 4, Place::Device});
  if (training && be.compute_dtype != DType::F32)
    m.push_back(
        {"gradient rounding scratch", size_t(std::min<int64_t>(c.total, kGradRoundChunk)) * c.act, Place::Device});
  if (training && optimizer) {
    m.push_back({"AdamW m", P * 4, Place::Device});
    m.push_back({"AdamW v", P * 4, Place::Device});
  }
  m.push_back({"layer-input checkpoints", c.stride_nh * size_t(s.n_layer + 1), Place::Device});
  m.push_back({"backward activations (dy, dx, recompute)", c.stride_nh * 3, Place::Device});
  m.push_back({"workspace (one layer's recompute + backward; chunked head)", c.workspace, Place::Device});
  const size_t K = size_t(std::max(micro, 1));
  m.push_back(
      {"token ids / targets / positions", 2 * K * size_t(c.max_tokens) * TokenUploader::kBytesPerToken, Place::Device});
  if (training && K > 1)
    m.push_back({"embedding-output gradients of the step's micro-batches", K * c.stride_nh, Place::Device});
  m.push_back({"RoPE tables", c.rope, Place::Device});
  m.push_back({"scalars", engine_scalar_bytes(c.blobs), Place::Device});
  if (be.stream_scratch) m.push_back({"kernel scratch (compute stream)", be.stream_scratch, Place::Device});
  m.push_back({"token staging", 2 * K * size_t(c.max_tokens) * TokenUploader::kBytesPerToken, Place::Pinned});
  return m;
}

std::vector<int> gpu_blob_order(const ModelSpec& s) {
  std::vector<int> order = {0, s.n_layer + 1};
  for (int l = 0; l < s.n_layer; ++l) order.push_back(1 + l);
  return order;
}

std::vector<MemoryItem> sliding_memory(const ModelSpec& s, int B, int T, int slots, const BackendInfo& be,
                                       const std::vector<int>& gpu_blobs, int micro, bool keep_grads,
                                       int64_t hold_grads) {
  // The sliding engine's buffers (engine/sliding_engine.cpp, slot_cache.cpp, host_optimizer.cpp).
  const Common c = common(s, B, T, be, gpu_blobs);
  const SlidingOptions defaults;
  const int64_t chunk = std::max<int64_t>(1, std::min(defaults.chunk, std::max(c.max_blob, c.gpu_total)));
  const size_t K = size_t(std::max(micro, 1));
  const bool low = be.compute_dtype != DType::F32;
  const ModelLayout lay = make_layout(s);
  int64_t held = 0;
  if (!keep_grads) {
    const std::vector<bool> h = held_grad_blobs(lay, gpu_blobs, hold_grads);
    for (size_t b = 0; b < h.size(); ++b)
      if (h[b]) held += lay.blobs[b].numel;
  }
  const HostOptimizer::Bytes hb =
      HostOptimizer::bytes_for(c.total, be.compute_dtype, keep_grads, chunk, defaults.grad_ring, held);
  std::vector<int64_t> host_numel;
  std::vector<bool> is_layer;
  for (size_t b = 0; b < lay.blobs.size(); ++b) {
    const bool kept = std::find(gpu_blobs.begin(), gpu_blobs.end(), int(b)) != gpu_blobs.end();
    host_numel.push_back(kept ? 0 : lay.blobs[b].numel);
    is_layer.push_back(lay.blobs[b].kind == BlobKind::Layer);
  }
  std::vector<MemoryItem> m = {
      {"parameter slots (" + std::to_string(slots) + ": one of the largest blob, the others of a layer)" +
           (low ? " + fp32 upload staging" : ""),
       SlotCache::bytes_for(SlotCache::capacities(slots, host_numel, is_layer), be.compute_dtype, chunk),
       Place::Device},
      {"fp32 gradient accumulators (2 layers, embedding, head)",
       2 * round256(size_t(c.max_layer_blob) * 4) + round256(size_t(c.emb) * 4) + round256(size_t(c.head) * 4),
       Place::Device},
      {"activations (" + std::to_string(K + 1) + " buffers: one per micro-batch + 1)", (K + 1) * c.stride_nh,
       Place::Device},
      {"checkpoints fetched for the backward + recompute output", 3 * c.stride_nh, Place::Device},
      {"workspace (one layer's recompute + backward; chunked head)", c.workspace, Place::Device},
      {"token ids / targets / positions", 2 * K * size_t(c.max_tokens) * TokenUploader::kBytesPerToken, Place::Device},
      {"RoPE tables", c.rope, Place::Device},
      {"scalars", engine_scalar_bytes(c.blobs), Place::Device}};
  if (low) m.push_back({"gradient staging (2 chunks)", 2 * round256(size_t(chunk) * c.act), Place::Device});
  if (c.gpu_total > 0) {
    const size_t G = size_t(c.gpu_total);
    m.push_back({std::to_string(gpu_blobs.size()) + " blobs kept on the GPU: fp32 master, AdamW m and v, gradients" +
                     (low ? ", compute copy" : ""),
                 G * (16 + (low ? c.act : 0)), Place::Device});
  }
  if (be.stream_scratch) m.push_back({"kernel scratch (compute stream)", be.stream_scratch, Place::Device});
  m.push_back({"fp32 master weights", hb.master, Place::Pinned});
  if (hb.grads)
    m.push_back({keep_grads ? "gradients of the step (held for the norm)"
                            : "gradient ring (" + std::to_string(defaults.grad_ring) + " chunks)",
                 hb.grads, Place::Pinned});
  m.push_back({"layer-input checkpoints (" + std::to_string(K) + " micro-batches)",
               K * c.stride_nh * size_t(std::max(s.n_layer, 1)), Place::Pinned});
  m.push_back({"token staging", 2 * K * size_t(c.max_tokens) * TokenUploader::kBytesPerToken, Place::Pinned});
  m.push_back({"AdamW m and v", hb.moments, Place::Host});
  return m;
}

Plan make_plan(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates) {
  if (r.batch <= 0 || r.seq <= 0) input_error("--batch-size/--seq-len", "must be positive");
  if (r.grad_accum <= 0) input_error("--grad-accum", "must be positive");
  if (r.slots != 0 && r.slots < 2) input_error("--slots", "the sliding engine needs at least 2 GPU parameter slots");
  const bool on_host = be.name == "cpu";  // the cpu backend's "device" memory is host memory
  Plan p;
  p.host_budget = r.host_budget ? r.host_budget : size_t(host_memory_available() * 0.95);
  // The CUDA device's default arena is 90% of the free memory.
  p.gpu_budget = r.gpu_budget ? r.gpu_budget : on_host ? p.host_budget : size_t(double(be.device_free) * 0.9);

  // Without clipping the host updates each blob as its gradient lands, but the first blobs of the
  // forward land last: the part of the host's work that does not fit into the backward is held and
  // runs during the next forward (SlidingOptions::hold_grads). Sized from the rates.
  const ModelLayout lay_all = make_layout(s);
  const Flops f_all = flops_per_token(s, r.seq);
  // Off unless SF_HOLD_GRADS=1 (a benchmark switch; a larger number holds that many parameters):
  // measured on the H200 machine it did not yet beat updating every blob as it lands
  // (docs/PERFORMANCE.md).
  static const long long hold_env = env_int("SF_HOLD_GRADS", 0);
  auto hold_for = [&](const std::vector<int>& gpu_blobs) -> int64_t {
    if (hold_env <= 0 || r.clip || !r.optimizer || on_host) return 0;
    if (hold_env > 1) return int64_t(hold_env);
    double P = double(lay_all.total_numel());
    for (int b : gpu_blobs) P -= double(lay_all.blobs[size_t(b)].numel);
    const double gpu_s = f_all.total * double(r.batch) * r.seq * r.grad_accum / (rates.model_tflops * 1e12);
    const double backward_s = gpu_s * (1.0 - f_all.forward / f_all.total);
    const double spill_s = P / rates.host_adamw_params_s - backward_s;
    return spill_s > 0 ? int64_t(spill_s * rates.host_adamw_params_s) : 0;
  };
  auto fill = [&](EngineKind engine, int slots, const std::vector<int>& gpu_blobs = {}) {
    p.engine = engine;
    p.slots = slots;
    p.gpu_blobs = gpu_blobs;
    p.items = engine == EngineKind::Resident
                  ? resident_memory(s, r.batch, r.seq, be, r.training, r.optimizer, r.grad_accum)
                  : sliding_memory(s, r.batch, r.seq, slots, be, gpu_blobs, r.grad_accum, r.clip || !r.optimizer,
                                   hold_for(gpu_blobs));
    p.hold_grads = engine == EngineKind::Sliding ? hold_for(gpu_blobs) : 0;
    p.gpu_bytes = total_bytes(p.items, Place::Device);
    p.pinned_bytes = total_bytes(p.items, Place::Pinned);
    p.host_bytes = p.pinned_bytes + total_bytes(p.items, Place::Host) + (on_host ? p.gpu_bytes : 0);
    p.short_of = Shortfall{};
    const bool gpu_known = p.gpu_budget > 0;
    // Headroom in the arena: 256-byte rounding of each buffer, the CUDA libraries' own needs.
    const size_t margin = std::max(size_t(256) << 20, p.gpu_budget / 100);
    if (!on_host && gpu_known && p.gpu_bytes + margin > p.gpu_budget)
      p.short_of = {Shortfall::Memory::Gpu, p.gpu_bytes, p.gpu_budget, 0};
    else if (p.host_budget > 0 && p.host_bytes > p.host_budget)
      p.short_of = {Shortfall::Memory::Host, p.host_bytes, p.host_budget, p.pinned_bytes};
    p.fits = p.short_of.memory == Shortfall::Memory::None;
  };
  // The sliding engine with `slots` slots, then as many blobs kept whole on the GPU as the budgets
  // allow (each moves ~18 bytes a parameter from the host to the GPU), or the requested number.
  const std::vector<int> order = gpu_blob_order(s);
  if (r.gpu_blobs > int(order.size()))
    input_error("--gpu-blobs", "the model has " + std::to_string(order.size()) + " blobs");
  auto sliding = [&](int slots) {
    if (r.gpu_blobs >= 0) {
      fill(EngineKind::Sliding, slots, std::vector<int>(order.begin(), order.begin() + r.gpu_blobs));
      return;
    }
    std::vector<int> keep;
    fill(EngineKind::Sliding, slots, keep);
    if (p.short_of.memory == Shortfall::Memory::Gpu) return;  // the GPU is short already
    for (int b : order) {                                     // keep each blob that still fits the GPU budget
      const Plan before = p;
      keep.push_back(b);
      fill(EngineKind::Sliding, slots, keep);
      if (p.short_of.memory == Shortfall::Memory::Gpu) {
        keep.pop_back();
        p = before;
      }
    }
  };

  if (r.offload == OffloadChoice::Off) {
    fill(EngineKind::Resident, 0);
  } else if (r.offload == OffloadChoice::On || r.slots > 0) {
    sliding(r.slots > 0 ? r.slots : 3);
    if (!p.fits && r.slots == 0) sliding(2);
  } else {
    fill(EngineKind::Resident, 0);
    if (!p.fits) {
      sliding(3);
      if (!p.fits) sliding(2);
    }
  }

  p.micro_batch = r.batch;
  p.micro_batches = r.grad_accum;
  // Short of GPU memory with the sliding engine: smaller micro-batches, more of them (layer-major
  // accumulation keeps the PCIe and host traffic of a step the same).
  if (p.engine == EngineKind::Sliding && p.short_of.memory == Shortfall::Memory::Gpu && r.split_micro) {
    for (int m = r.batch / 2; m >= 1; --m) {
      if (r.batch % m != 0) continue;
      PlanRequest q = r;
      q.batch = m;
      q.grad_accum = r.grad_accum * (r.batch / m);
      q.split_micro = false;
      Plan sub = make_plan(s, q, be, rates);
      if (sub.fits) return sub;
    }
  }

  // Prediction: a lower bound from the rates, assuming the schedule overlaps what it can.
  const ModelLayout lay = make_layout(s);
  double P = double(lay.total_numel());  // parameters updated on the host
  bool emb_on_host = true;
  for (int b : p.gpu_blobs) {
    P -= double(lay.blobs[size_t(b)].numel);
    emb_on_host &= b != 0;
  }
  const double tokens = double(r.batch) * r.seq * r.grad_accum;
  const Flops f = flops_per_token(s, r.seq);
  p.flops = f.total * tokens;
  p.gpu_s = p.flops / (rates.model_tflops * 1e12);
  if (p.engine == EngineKind::Resident) {
    p.step_s = p.gpu_s;
  } else {
    const double act = double(dtype_size(be.compute_dtype));
    const double ckpt = double(s.n_layer) * double(r.batch) * r.seq * double(s.hidden) * act;
    const double update_s = P / rates.host_adamw_params_s;  // one fused pass (bf16 gradient in)
    p.host_s = update_s;
    // Layer-major micro-batches: weights cross PCIe once a step (fp32 up, cast on the GPU; twice,
    // forward and backward) and gradients once (compute dtype down), whatever grad_accum is.
    const double up = 2 * P * 4 + r.grad_accum * ckpt, down = P * act + r.grad_accum * ckpt;
    p.pcie_s = std::max(up, down) / (rates.pcie_gbs * 1e9);
    // With clipping the update waits for the backward and overlaps only the next forward (in
    // forward order). Without, each blob's update runs during the backward, but the embedding's
    // comes last and the next forward needs it first.
    // Each phase is at least as long as its own uploads (a layer's fp32 weights can outlast its
    // compute: 8B's forward is PCIe-bound at 24 GiB); checkpoints go down in the forward and come
    // back up in the backward.
    const double up_fwd_s = P * 4 / (rates.pcie_gbs * 1e9),
                 up_bwd_s = up_fwd_s + r.grad_accum * ckpt / (rates.pcie_gbs * 1e9);
    const double fwd_s = std::max(p.gpu_s * (f.forward / f.total), up_fwd_s),
                 bwd_s = std::max(p.gpu_s * (1.0 - f.forward / f.total), up_bwd_s);
    const double emb_update_s = emb_on_host ? double(lay.embedding().numel) / rates.host_adamw_params_s : 0.0;
    double path = fwd_s + std::max(bwd_s, p.host_s) + emb_update_s;
    if (r.clip && env_switch("SF_SPLIT_UPDATE", true)) {
      // Split update (SlidingOptions::split_update): each phase is bound by the GPU, by PCIe, or
      // by the host memory bus, which the CPU passes and the DMA share (session 5: moving bytes
      // from CPU passes to DMA, by running some layers' AdamW on the GPU with their state streamed
      // through PCIe, made the step slower: DMA bytes cost the bus as much). Forward: the
      // parameter passes (16 + act bytes a parameter), the fp32 uploads, the checkpoints going
      // down. Then the head, which waits for the last layer. Backward: the moment passes
      // (16 + act), the uploads again, the gradients down, the checkpoints up.
      // The bus rate: the fused pass's 24 + act bytes a parameter at the host AdamW rate (measured
      // beside the step's DMA), times 1.2: the CPU passes (with software prefetch) and the DMA
      // together reach more (session 5, H200 machine: the 3B clipped forward moved 73.5 GB in
      // ~0.47 s, ~156 GB/s, against 138 for the fused pass alone); 1.2 keeps the bound below.
      const double pass = 16 + act;
      const double bus = rates.host_adamw_params_s * (24 + act) * 1.2;
      const double K = r.grad_accum;
      const double head_s = p.gpu_s * (f.head / f.total);
      const double layers_fwd_gpu = p.gpu_s * ((f.forward - f.head / 3) / f.total),
                   layers_bwd_gpu = p.gpu_s * (1.0 - (f.forward + f.head * 2 / 3) / f.total);
      const double fwd_host = (P * pass + P * 4 + K * ckpt) / bus;
      const double fwd_pcie = std::max(up_fwd_s, K * ckpt / (rates.pcie_gbs * 1e9));  // checkpoints go down
      const double bwd_host = (P * pass + P * 4 + P * act + K * ckpt) / bus;
      // Two slots and a tied embedding on the host: the layers evict it, the head uploads it again.
      const double head_upload_s = p.slots <= 2 && s.tie_embeddings && emb_on_host
                                       ? double(lay.embedding().numel) * 4 / (rates.pcie_gbs * 1e9)
                                       : 0.0;
      p.host_s = 2 * P / rates.host_adamw_params_s * (pass / (24 + act));
      path = std::max({layers_fwd_gpu, fwd_host, fwd_pcie}) + head_s + head_upload_s +
             std::max({layers_bwd_gpu, bwd_host, up_bwd_s});
    } else if (r.clip) {
      path = fwd_s + bwd_s + std::max(0.0, update_s - fwd_s);
    }
    p.step_s = std::max({path, p.host_s, p.pcie_s});
  }
  p.tokens_per_s = tokens / p.step_s;
  if (on_host) p.step_s = p.gpu_s = p.host_s = p.pcie_s = p.tokens_per_s = 0;  // the rates are a GPU machine's
  return p;
}

std::string plan_summary(const Plan& p) {
  std::string s = std::string("plan: ") + engine_name(p.engine) + " engine" +
                  (p.engine == EngineKind::Sliding ? ", " + std::to_string(p.slots) + " GPU slots, " +
                                                         std::to_string(p.gpu_blobs.size()) + " blobs kept on the GPU"
                                                   : std::string()) +
                  (p.micro_batch > 0 ? "; micro-batches of " + std::to_string(p.micro_batch) + " x " +
                                           std::to_string(p.micro_batches) + " a step"
                                     : std::string()) +
                  "; device " + format_bytes(p.gpu_bytes) + ", host " + format_bytes(p.host_bytes) + " (" +
                  format_bytes(p.pinned_bytes) + " pinned)";
  if (p.tokens_per_s > 0) s += "; predicted at best " + std::to_string(int64_t(p.tokens_per_s)) + " tokens/s";
  return s;
}

std::string format_plan(const ModelSpec& s, const PlanRequest& r, const Plan& p) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "plan: %s, %.2fB parameters, %d x %d tokens x %d micro-batches a step%s\n",
                s.architecture.c_str(), double(s.total_params()) / 1e9, p.micro_batch, r.seq, p.micro_batches,
                p.micro_batch != r.batch ? " (batches split to fit the GPU)" : "");
  o << line;
  o << "engine: " << engine_name(p.engine)
    << (p.engine == EngineKind::Sliding ? " (" + std::to_string(p.slots) + " GPU slots, " +
                                              std::to_string(p.gpu_blobs.size()) + " blobs kept whole on the GPU)"
                                        : "")
    << "\n";
  for (Place where : {Place::Device, Place::Pinned, Place::Host}) {
    const size_t n = total_bytes(p.items, where);
    if (n == 0) continue;
    o << (where == Place::Device   ? "GPU memory"
          : where == Place::Pinned ? "host, pinned"
                                   : "host, pageable")
      << ": " << format_bytes(n) << "\n";
    for (const MemoryItem& m : p.items) {
      if (m.place != where) continue;
      std::snprintf(line, sizeof line, "  %12s  %s\n", format_bytes(m.bytes).c_str(), m.name.c_str());
      o << line;
    }
  }
  o << "budgets: GPU " << (p.gpu_budget ? format_bytes(p.gpu_budget) : std::string("unknown")) << ", host "
    << (p.host_budget ? format_bytes(p.host_budget) : std::string("unknown")) << "\n";
  o << (p.fits ? "fits" : "DOES NOT FIT: " + p.why()) << "\n";
  if (p.step_s > 0) {
    std::snprintf(line, sizeof line,
                  "predicted (lower bound from the rates): %.3f s a step, %.0f tokens/s (GPU %.3f s, host %.3f s, "
                  "PCIe %.3f s)\n",
                  p.step_s, p.tokens_per_s, p.gpu_s, p.host_s, p.pcie_s);
    o << line;
  }
  return o.str();
}

}  // namespace sf

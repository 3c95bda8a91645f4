#include "engine/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "core/align.h"
#include "core/error.h"
#include "core/split_master.h"
#include "core/units.h"
#include "engine/checkpoint_store.h"
#include "engine/engine.h"
#include "engine/kept_activations.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "engine/state_stream.h"
#include "io/nvme_store.h"
#include "model/layout.h"
#include "model/program.h"

namespace sf {

namespace {

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
// The same fields also carry a step's GPU work (gpu_work_per_token: FLOPs weighted by their
// kind's rate), whose shares split the sliding engine's phases.
struct Flops {
  double total = 0, forward = 0;
  double head = 0;  // of total: the head's forward and backward (the lm-head products)
};
// Keys a query sees, summed over the decoder layers, averaged over a row of T tokens: T/2 for causal
// attention ((T + 1) / 2 exactly), W - W(W - 1) / 2T for a local layer's window W < T (Gemma 3).
double layer_attention_keys(const ModelSpec& s, int T, int l) {
  const double W = double(s.local_window);
  return s.is_local(l) && W < T ? W - W * (W - 1) / (2.0 * T) : 0.5 * T;
}
// Layer l's attention width n_head x head dim (Gemma 4's global layers: their own head dim).
double layer_q_dim(const ModelSpec& s, int l) {
  return s.arch == Arch::Gemma4 ? double(s.n_head) * s.gemma4.head_dim[size_t(l)] : double(s.q_dim());
}
// QK^T and PV over the keys each query sees, summed over the decoder layers (4 x width x keys).
double attention_flops_per_token(const ModelSpec& s, int T) {
  double f = 0;
  for (int l = 0; l < s.n_layer; ++l) f += 4.0 * layer_q_dim(s, l) * layer_attention_keys(s, T, l);
  return f;
}

// The matrix parameters a token multiplies in layer l's forward, and in its recompute (a dense
// Llama layer skips its down projection there; Program::layer_recompute).
struct LayerMatrixParams {
  double forward = 0, recompute = 0;
};
LayerMatrixParams layer_matrix_params(const ModelSpec& s, int l) {
  if (s.arch == Arch::Gemma4) {  // per-layer widths; no k/v projections on K/V-sharing layers, no v where k = v
    const Gemma4Spec& g = s.gemma4;
    const double H = double(s.hidden), Q = layer_q_dim(s, l);
    const double KV = double(g.kv_heads[size_t(l)]) * g.head_dim[size_t(l)];
    const double kv = g.kv_shared(l) ? 0.0 : (g.k_eq_v && !s.is_local(l) ? 1.0 : 2.0) * H * KV;
    double fwd = 2 * H * Q + kv + 3 * H * double(g.mlp_intermediate(l, s.intermediate));
    if (g.moe_block)  // beside the dense MLP: the router and the top_k experts a token multiplies
      fwd += double(s.moe.n_expert) * H + double(s.moe.top_k) * 3 * H * double(s.moe.intermediate);
    return {fwd, fwd};  // sandwich norms: the recompute runs the whole layer
  }
  const double H = double(s.hidden), Q = double(s.q_dim()), KV = double(s.kv_dim()), I = double(s.intermediate);
  const double Ie = double(s.moe.intermediate);
  const double mlp = s.moe_layer(l) ? double(s.moe.n_expert) * H + double(s.moe.top_k) * 3 * H * Ie : 3 * H * I;
  const double fwd = H * Q + 2 * H * KV + Q * H + mlp;
  return {fwd, fwd - (s.moe_layer(l) || s.sandwich_norm ? 0.0 : H * I)};
}

// Mixture-of-experts layers count their active parameters: the router and top_k experts (the
// FLOPs a token costs; MFU on active parameters).
Flops flops_per_token(const ModelSpec& s, int T) {
  const double H = double(s.hidden);
  double Pd = 0;  // the decoder layers' matrix parameters a token multiplies
  double Pr = 0;  // of which the recompute multiplies (a dense Llama layer skips its down projection)
  for (int l = 0; l < s.n_layer; ++l) {
    Pd += layer_matrix_params(s, l).forward;
    Pr += layer_matrix_params(s, l).recompute;
  }
  const double Ph = double(s.vocab) * H;
  const double attn_fwd = attention_flops_per_token(s, T);  // QK^T and PV over the keys seen
  Flops f;
  f.forward = 2 * Pd + 2 * Ph + attn_fwd;
  // + recompute (2 Pr, 1x attention; Program::layer_recompute) + backward (4 Pd + 4 Ph, 2.5x attention)
  f.total = 6 * Pd + 2 * Pr + 6 * Ph + 4.5 * attn_fwd;
  f.head = 6 * Ph;
  return f;
}

// What one FLOP of each kind is worth in FLOPs at the model rate (work / model rate = seconds).
// The model rate is a whole step's at kRateSeqLen-token sequences, attention at that length
// included; attention ran below it (the H200's kernels of session 9: 371 / 330 TFLOP/s forward /
// backward against 510), so at long sequences, where attention is a large share, the model rate
// alone predicted too fast (8B at 32768 tokens: 5,223 tokens/s planned, 3,925 measured); today's
// run above it at long sequences (657 / 524, session 23). So attention is priced at the
// kernel's own rates, and the rest of the step (matrix products and the memory-bound kernels
// between them) at what the reference step leaves: its seconds at the model rate less its
// attention's at the kernel's rates. At kRateSeqLen the step's time is unchanged.
struct WorkWeights {
  double matrix = 1, attn_fwd = 1, attn_bwd = 1;
};
// The attention rates are head dim 128's. A smaller head does less work a byte moved (the H200's
// kernels: 0.72-0.76x at 64, about sqrt(64 / 128)). Head dim 256 (Gemma 3) on the H200 (B 8,
// T 2048, causal), the sm_90 kernels (session 20): forward 491 TFLOP/s against hd 128's 487
// (session 19), 1.0x; backward 274-279 against 360, 0.77x. Wider heads (Gemma 4's 512, the simple
// kernels) are slower still, not measured: the sm_80 hd-256 kernels' shares (0.53x, 0.38x in
// session 19) as a bound.
struct HeadDimFactors {
  double fwd = 1, bwd = 1;
};
HeadDimFactors head_dim_factors(int head_dim) {
  if (head_dim < 128) {
    const double f = std::sqrt(double(std::max(head_dim, 1)) / 128.0);
    return {f, f};
  }
  if (head_dim == 128) return {};
  if (head_dim <= 256) return {1.0, 0.77};
  return {0.53, 0.38};
}

WorkWeights work_weights(const ModelSpec& s, const Rates& r) {
  const HeadDimFactors hd = head_dim_factors(s.head_dim);
  const double model = r.model_tflops * 1e12, fwd = r.attn_fwd_tflops * 1e12 * hd.fwd,
               bwd = r.attn_bwd_tflops * 1e12 * hd.bwd;
  const Flops ref = flops_per_token(s, kRateSeqLen);
  const double af = attention_flops_per_token(s, kRateSeqLen);
  const double rest_s = ref.total / model - (2 * af / fwd + 2.5 * af / bwd);  // forward + recompute, backward
  // Rates that leave the rest under a quarter of its time at the model rate are inconsistent (an
  // attention rate far below the step's own): the rest is not priced below that.
  const double matrix = std::max(rest_s * model / (ref.total - 4.5 * af), 0.25);
  return {matrix, model / fwd, model / bwd};
}

// A token's GPU work in one training step, in FLOPs at the model rate, with every layer recomputed.
Flops gpu_work_per_token(const ModelSpec& s, int T, const Rates& r) {
  const Flops f = flops_per_token(s, T);
  const WorkWeights w = work_weights(s, r);
  const double af = attention_flops_per_token(s, T);
  Flops g;
  g.forward = (f.forward - af) * w.matrix + af * w.attn_fwd;
  g.total = (f.total - 4.5 * af) * w.matrix + 2 * af * w.attn_fwd + 2.5 * af * w.attn_bwd;
  g.head = f.head * w.matrix;
  return g;
}

// What selective recompute saves a token, weighted (w = {1, 1, 1}: FLOPs).
double recompute_saved_per_token(const ModelSpec& s, int T, int whole_layers, int kept_layers, const WorkWeights& w) {
  double saved = 0;
  for (int l = 0; l < std::min(whole_layers + kept_layers, s.n_layer); ++l)
    saved += 4 * layer_q_dim(s, l) * layer_attention_keys(s, T, l) * w.attn_fwd +
             (l < whole_layers ? 2 * layer_matrix_params(s, l).recompute * w.matrix : 0.0);
  return saved;
}

}  // namespace

double attention_forward_flops(int64_t B, int64_t T, int64_t n_head, int64_t head_dim) {
  return 4.0 * double(B) * double(T) * (0.5 * double(T)) * double(n_head) * double(head_dim);
}

double gpu_seconds_per_token(const ModelSpec& s, int T, const Rates& rates) {
  return gpu_work_per_token(s, T, rates).total / (rates.model_tflops * 1e12);
}

double train_flops_per_token(const ModelSpec& s, int T, bool with_recompute) {
  const Flops f = flops_per_token(s, T);
  return with_recompute ? f.total : 3 * f.forward;
}

double recompute_flops_saved_per_token(const ModelSpec& s, int T, int whole_layers, int kept_layers) {
  return recompute_saved_per_token(s, T, whole_layers, kept_layers, WorkWeights{});
}

const char* engine_name(EngineKind k) { return k == EngineKind::Sliding ? "sliding" : "resident"; }

const char* copies_choice_name(CopiesChoice c) {
  return c == CopiesChoice::On ? "on" : c == CopiesChoice::Off ? "off" : "auto";
}

const char* bound_name(Bound b) {
  switch (b) {
    case Bound::Gpu:
      return "GPU";
    case Bound::Pcie:
      return "PCIe";
    case Bound::Host:
      return "host";
    case Bound::Disk:
      return "disk";
    case Bound::Phases:
      break;
  }
  return "phases";
}

std::optional<Setting> Shortfall::setting() const {
  switch (memory) {
    case Memory::Gpu:
      return Setting::GpuMemory;
    case Memory::Host:
      return Setting::HostMemory;
    case Memory::Disk:
      return Setting::DiskMemory;
    case Memory::None:
      break;
  }
  return std::nullopt;
}

SettingText Shortfall::phrase() const {
  switch (memory) {
    case Memory::Gpu: {
      SettingText t{"needs " + format_bytes(needs) + " of GPU memory, " + format_bytes(available) + " available (",
                    Setting::GpuMemory, ")"};
      if (kept > 0)
        t += {", " + format_bytes(kept) + " of it selective recompute's kept activations (", Setting::KeepLayers, ", ",
              Setting::KeepAttention, ")"};
      return t;
    }
    case Memory::Host: {
      SettingText t{"needs " + format_bytes(needs) + " of host memory (" + format_bytes(pinned) + " pinned), " +
                        format_bytes(available) + " available (",
                    Setting::HostMemory, ")"};
      if (copies > 0) t += {", " + format_bytes(copies) + " of it upload copies (", Setting::UploadCopies, ")"};
      return t;
    }
    case Memory::Disk:
      return {"needs " + format_bytes(needs) +
                  " in the offload directory (AdamW state, masters, weights, checkpoints), " + format_bytes(available) +
                  " available (",
              Setting::DiskMemory, ")"};
    case Memory::None:
      break;
  }
  return {};
}

namespace {

// What the engines' buffer lists need of a backend at B x T (engine/buffers.h).
BackendSizes backend_sizes(const ModelSpec& s, int B, int T, const BackendInfo& be) {
  const BatchDims d{B, T, {}};
  return BackendSizes{be.compute_dtype,
                      Workspace::bytes_for(s, B, T, be.compute_dtype, be.attention_ws(attn_dims(s, d)),
                                           be.linear_ce_ws(d.N(), s.hidden, s.vocab)),
                      be.stream_scratch};
}

}  // namespace

std::vector<MemoryItem> resident_memory(const ModelSpec& s, const EngineOptions& o, const BackendInfo& be) {
  return merge_by_name(ResidentEngine::buffers(s, o, backend_sizes(s, o.max_batch, o.max_seq, be)));
}

std::vector<int> gpu_blob_order(const ModelSpec& s) {
  std::vector<int> order = {0, s.n_layer + 1};
  for (int l = 0; l < s.n_layer; ++l) order.push_back(1 + l);
  return order;
}

SlidingOptions sliding_options(const Plan& p, const EngineOptions& base, bool keep_grads) {
  SlidingOptions o;  // the default chunk, gradient ring and pieces
  o.base = base;
  o.base.max_micro = std::max(base.max_micro, 1);
  o.base.whole_layers = p.whole_layers;  // selective recompute, per micro-batch
  o.base.kept_layers = p.kept_layers;
  o.slots = p.slots;
  o.gpu_blobs = p.gpu_blobs;
  o.keep_grads = keep_grads;
  o.hold_grads = p.hold_grads;
  o.hold_early = p.hold_early;
  o.disk_blobs = p.disk_blobs;
  o.ckpt_disk_layers = p.ckpt_disk_layers;
  o.disk_masters = p.disk_masters;
  o.disk_weights = p.disk_weights;
  o.disk_grads = p.disk_grads;
  o.upload_copies = p.upload_copies;
  if (p.ckpt_disk_layers > 0) o.store.cufile = p.ckpt_cufile;  // how the checkpoints on disk move
  o.lend_checkpoints = p.lend_checkpoints;
  return o;
}

std::vector<MemoryItem> sliding_memory(const ModelSpec& s, const SlidingOptions& o, const BackendInfo& be) {
  return sliding_memory(s, make_layout(s), o, be);
}

std::vector<MemoryItem> sliding_memory(const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o,
                                       const BackendInfo& be) {
  return merge_by_name(SlidingEngine::buffers(s, lay, o, backend_sizes(s, o.base.max_batch, o.base.max_seq, be)));
}

std::vector<int> disk_blob_order(const ModelSpec& s) {
  std::vector<int> order;
  for (int l = s.n_layer - 1; l >= 0; --l) order.push_back(1 + l);
  return order;
}

namespace {

// The step time of a plan (below); the planner compares the sliding placements' by it.
// `lay`: make_layout(s), made once by the caller (the planner predicts thousands of candidates).
void predict(const ModelSpec& s, const ModelLayout& lay, const PlanRequest& r, const BackendInfo& be,
             const Rates& rates, Plan& p);

// make_plan's steps for one request: the budgets, each candidate placement's buffers and fit, the
// choice among them.
class Planner {
 public:
  Planner(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates)
      : s_(s), r_(r), be_(be), rates_(rates), on_host_(be.kind == DeviceKind::Cpu), lay_(make_layout(s)) {
    p_.host_budget = r.host_budget ? r.host_budget : size_t(host_memory_available() * 0.95);
    // The CUDA device's default arena is 90% of the free memory.
    p_.gpu_budget = r.gpu_budget ? r.gpu_budget : on_host_ ? p_.host_budget : default_gpu_budget(be.device_free);
    if (!r.offload_dir.empty())
      p_.disk_budget = r.disk_budget ? r.disk_budget : size_t(double(free_disk_bytes(r.offload_dir)) * 0.95);
  }

  // The engine: resident if it fits (or is asked for), else the sliding one with 3 slots, or 2.
  Plan choose() {
    if (r_.offload == OffloadChoice::Off) {
      fill(EngineKind::Resident, 0);
      keep_activations();
    } else if (r_.offload == OffloadChoice::On || r_.slots > 0) {
      if (r_.slots > 0)
        slide(r_.slots);
      else
        slide_auto();
    } else {
      fill(EngineKind::Resident, 0);
      keep_activations();
      if (!p_.fits) slide_auto();
    }
    p_.micro_batch = r_.batch;
    p_.micro_batches = r_.grad_accum;
    return p_;
  }

 private:
  // Selective recompute: a resident training plan that fits spends the GPU budget's spare room on
  // kept activations — first attention's output in every layer it has room for (A bytes a layer,
  // KeptActivations::attention_bytes: attention is the costliest op to recompute per byte kept),
  // then layers kept whole (F bytes, Workspace::forward_bytes_for: no recompute), each upgraded
  // from an attention-kept one for F - A more. A requested count (PlanRequest) is taken as it is
  // (the plan may then not fit) and the other fills what is left. None on the cpu backend unless
  // asked: its "GPU" is host memory, and it is the reference path.
  void keep_activations() {
    if (p_.engine != EngineKind::Resident || !r_.training || !p_.fits) return;
    const bool auto_whole = r_.whole_layers < 0, auto_kept = r_.kept_layers < 0;
    const int L = s_.n_layer;
    int whole = auto_whole ? 0 : r_.whole_layers, kept = auto_kept ? 0 : r_.kept_layers;
    if ((auto_whole || auto_kept) && !on_host_ && p_.gpu_budget > 0) {
      const size_t A = KeptActivations::attention_bytes(s_, r_.batch, r_.seq, be_.compute_dtype);
      const size_t F = Workspace::forward_bytes_for(s_, r_.batch, r_.seq, be_.compute_dtype);
      const size_t used = p_.gpu_bytes + gpu_margin() + size_t(whole) * F + size_t(kept) * A;
      size_t spare = used < p_.gpu_budget ? p_.gpu_budget - used : 0;
      if (auto_kept) {
        const int n = int(std::min(spare / A, size_t(std::max(L - whole, 0))));
        kept += n;
        spare -= size_t(n) * A;
      }
      if (auto_whole) {
        const int up = auto_kept && F > A ? int(std::min(spare / (F - A), size_t(kept))) : 0;
        kept -= up;
        whole += up;
        spare -= size_t(up) * (F - A);
        whole += int(std::min(spare / F, size_t(std::max(L - whole - kept, 0))));
      }
    }
    if (whole > 0 || kept > 0) {
      whole_ = whole;
      kept_ = kept;
      fill(EngineKind::Resident, 0);
    }
  }

  // Selective recompute in the sliding engine (training on a GPU): its kept activations compete
  // with blobs kept on the GPU for the same memory — a layer kept whole saves its recompute's
  // FLOPs (GPU time), a blob kept on the GPU saves its uploads, its gradient's download and its
  // host AdamW (PCIe and host time). Which is worth more depends on which bound the step is at, so
  // every candidate (layers kept whole 0..L, each with attention kept in none or all of the rest;
  // a requested count as it is) gets the sliding placement that fills what it leaves (`sliding`:
  // blobs kept on the GPU, the NVMe tier), and the fastest predicted plan that fits wins — by at
  // least kMinGain over the earlier candidates in that order (fewer layers kept whole, then
  // attention kept in none): the prediction is a lower bound, a smaller gain is within its error.
  // The kept buffers are per micro-batch (every micro-batch's forward of a layer runs before its
  // backward): a step of K micro-batches keeps K times the bytes. None on the cpu backend unless
  // asked (its "GPU" is host memory, and it is the reference path).
  static constexpr double kMinGain = 0.01;
  void slide(int slots) {
    const bool auto_whole = r_.whole_layers < 0, auto_kept = r_.kept_layers < 0;
    const int L = s_.n_layer;
    whole_ = auto_whole ? 0 : r_.whole_layers;
    kept_ = auto_kept ? 0 : r_.kept_layers;
    const int w_first = whole_;
    if (!r_.training || ((auto_whole || auto_kept) && (on_host_ || p_.gpu_budget == 0))) {
      if (!r_.training) whole_ = kept_ = 0;
      sliding(slots);
      return;
    }
    Plan best;
    bool have = false;
    // Layers kept whole: each count up to 8, then steps of L/16 (a deep model plans in a second, not
    // several) and the last; a requested kept count leaves L - kept to keep whole.
    const int w_last = auto_whole ? L - kept_ : whole_, w_step = std::max(1, L / 16);
    for (int w = whole_; w <= w_last; w = w < 8 || w == w_last ? w + 1 : std::min(w + w_step, w_last)) {
      std::vector<int> as = {auto_kept ? 0 : kept_};
      if (auto_kept && L - w > 0) as.push_back(L - w);
      bool more = true;  // the fewest activations of this w fit: more layers kept whole may too
      for (int a : as) {
        whole_ = w;
        kept_ = a;
        sliding(slots);
        if (!p_.fits) {
          if (!have && w == w_first && a == as.front()) best = p_;  // the refusal to report
          if (a == as.front()) more = false;
          continue;
        }
        predict(s_, lay_, r_, be_, rates_, p_);
        if (!have || p_.step_s < best.step_s * (1 - kMinGain)) {
          best = p_;
          have = true;
        }
      }
      if (!more) break;
    }
    p_ = best;
    whole_ = p_.whole_layers;
    kept_ = p_.kept_layers;
  }
  // The sliding engine with the slot count the planner picks: placed from 3 slots, and from 2 (the
  // fewest that overlap an upload with the compute: a layer's slot and the next one's), whose
  // memory may hold one more blob kept on the GPU; 2 where its prediction is kMinGain shorter
  // (or 3 does not fit). Either gets more slots from what its placement leaves (add_slots). The
  // third slot lets an upload start before the layer two back is done (3B all-host with clipping,
  // session 14: 2 slots 0.98x 3).
  void slide_auto() {
    slide(3);
    if (!r_.training || on_host_) {
      if (!p_.fits) slide(2);
      return;
    }
    const Plan three = p_;
    slide(2);
    if (three.fits && p_.fits && three.step_s > 0 && !(p_.step_s < three.step_s * (1 - kMinGain))) p_ = three;
    if (three.fits && !p_.fits) p_ = three;
    whole_ = p_.whole_layers;
    kept_ = p_.kept_layers;
  }

  // Headroom in the arena: 256-byte rounding of each buffer, the CUDA libraries' own needs.
  size_t gpu_margin() const { return std::max(size_t(256) << 20, p_.gpu_budget / 100); }

  // The plan of one placement: its buffers, their totals by place, whether they fit the budgets.
  // Selective recompute's layers kept whole and keeping attention (whole_, kept_) count in both engines.
  void fill(EngineKind engine, int slots, const std::vector<int>& gpu_blobs = {},
            const std::vector<int>& disk_blobs = {}, int ckpt_disk_layers = 0,
            const std::vector<int>& disk_masters = {}, const std::vector<int>& disk_weights = {},
            const std::vector<int>& disk_grads = {}) {
    p_.engine = engine;
    p_.whole_layers = r_.training ? whole_ : 0;
    p_.kept_layers = r_.training ? kept_ : 0;
    p_.slots = slots;
    p_.gpu_blobs = gpu_blobs;
    p_.disk_blobs = disk_blobs;
    p_.ckpt_disk_layers = ckpt_disk_layers;
    p_.disk_masters = disk_masters;
    p_.disk_weights = disk_weights;
    p_.disk_grads = disk_grads;
    p_.ckpt_cufile = r_.ckpt_cufile;
    p_.lend_checkpoints = r_.lend_checkpoints;
    p_.hold_grads = engine == EngineKind::Sliding && !r_.clip && r_.optimizer && !on_host_ ? hold_ : 0;
    p_.hold_early = p_.hold_grads > 0 ? hold_early_ : 0.0;
    // Upload copies: the first copies_ host blobs (forward order) whose state is in host memory.
    p_.upload_copies.clear();
    p_.upload_copy_bytes = 0;
    size_t copies_add = 0;  // the host memory they add: a bf16 copy only its split master's tie bits
    for (int b = 0;
         engine == EngineKind::Sliding && b < int(lay_.blobs.size()) && int(p_.upload_copies.size()) < copies_; ++b) {
      auto has = [b](const std::vector<int>& v) { return std::find(v.begin(), v.end(), b) != v.end(); };
      if (has(gpu_blobs) || has(disk_blobs)) continue;
      p_.upload_copies.push_back(b);
      const int64_t n = lay_.blobs[size_t(b)].numel;
      p_.upload_copy_bytes += size_t(n) * dtype_size(be_.compute_dtype);
      copies_add += upload_copy_splits(be_.compute_dtype) ? size_t(split_tie_bytes(n))
                                                          : size_t(n) * dtype_size(be_.compute_dtype);
    }
    EngineOptions base;
    base.max_batch = r_.batch;
    base.max_seq = r_.seq;
    base.max_micro = std::max(r_.grad_accum, 1);
    base.state_dtype = r_.state_dtype;
    base.whole_layers = p_.whole_layers;
    base.kept_layers = p_.kept_layers;
    p_.backward_uploads.clear();
    p_.uploads_per_step = 0;
    if (engine == EngineKind::Resident) {
      EngineOptions o = base;
      o.training = r_.training;
      o.optimizer = r_.optimizer;
      p_.items = resident_memory(s_, o, be_);
    } else {
      const SlidingOptions so = sliding_options(p_, base, r_.clip || !r_.optimizer);
      p_.items = sliding_memory(s_, lay_, so, be_);
      count_uploads(so);
    }
    p_.disk_bytes = total_bytes(p_.items, Place::Disk);
    p_.disk_write_bytes = double(p_.disk_bytes);
    p_.disk_read_bytes = double(p_.disk_bytes);
    for (int b : p_.backward_uploads)  // a working copy's second read (StateStream's "disk.work" regions)
      if (std::find(disk_weights.begin(), disk_weights.end(), b) != disk_weights.end())
        p_.disk_read_bytes +=
            double(NvmeStore::aligned(uint64_t(lay_.blobs[size_t(b)].numel) * dtype_size(be_.compute_dtype)));
    p_.gpu_bytes = total_bytes(p_.items, Place::Device);
    p_.pinned_bytes = total_bytes(p_.items, Place::Pinned);
    p_.host_bytes = p_.pinned_bytes + total_bytes(p_.items, Place::Host) + (on_host_ ? p_.gpu_bytes : 0);
    p_.short_of = Shortfall{};
    const bool gpu_known = p_.gpu_budget > 0;
    const size_t margin = gpu_margin();
    if (!on_host_ && gpu_known && p_.gpu_bytes + margin > p_.gpu_budget)
      p_.short_of = {Shortfall::Memory::Gpu, p_.gpu_bytes, p_.gpu_budget, 0,
                     total_bytes(items_with(p_.items, "whole"), Place::Device) +
                         total_bytes(items_with(p_.items, "kept"), Place::Device)};
    else if (p_.host_budget > 0 && p_.host_bytes > p_.host_budget)
      p_.short_of = {Shortfall::Memory::Host, p_.host_bytes, p_.host_budget, p_.pinned_bytes, 0, copies_add};
    else if (p_.disk_bytes > p_.disk_budget)
      p_.short_of = {Shortfall::Memory::Disk, p_.disk_bytes, p_.disk_budget, 0};
    p_.fits = p_.short_of.memory == Shortfall::Memory::None;
  }

  // A training step's uploads as the engine with these options makes them (the slot policy over
  // its schedule): every host blob in the forward, again in the backward those the slots no longer
  // hold. Without training, every host blob in each pass as before (the loss alone: one pass).
  void count_uploads(const SlidingOptions& so) {
    p_.backward_uploads.clear();
    p_.uploads_per_step = 0;
    if (!r_.training) {
      for (size_t b = 0; b < lay_.blobs.size(); ++b)
        if (std::find(so.gpu_blobs.begin(), so.gpu_blobs.end(), int(b)) == so.gpu_blobs.end()) {
          p_.backward_uploads.push_back(int(b));
          p_.uploads_per_step += 2;
        }
      return;
    }
    // The replay depends on the slot count and the blobs kept on the GPU alone (the schedule's slot
    // requests are the same whatever is held, on disk or copied): one replay for each of those the
    // search tries (it fills thousands of placements; replaying each made the planner's tests 3x
    // slower under ASan).
    std::vector<int> key = so.gpu_blobs;
    std::sort(key.begin(), key.end());
    key.push_back(so.slots);
    key.push_back(so.keep_grads ? 1 : 0);
    auto it = uploads_.find(key);
    if (it == uploads_.end()) {
      Uploads u;
      for (const SlidingEngine::Upload& x : SlidingEngine::pass_uploads(s_, lay_, so)) {
        if (x.phase == Phase::Backward) u.backward.push_back(x.blob);
        ++u.count;
      }
      it = uploads_.emplace(std::move(key), std::move(u)).first;
    }
    p_.uploads_per_step = it->second.count;
    p_.backward_uploads = it->second.backward;
  }

  // The sliding engine with `slots` slots, then as many blobs kept whole on the GPU as the budgets
  // allow (each moves ~16-18 bytes a parameter from the host to the GPU), or the requested number.
  void sliding(int slots) {
    copies_ = r_.upload_copies == CopiesChoice::On ? std::numeric_limits<int>::max() : 0;
    hold_ = r_.hold_grads > 1 ? r_.hold_grads : 0;
    hold_early_ = std::clamp(r_.hold_early, 0.0, 1.0);
    const std::vector<int> order = gpu_blob_order(s_);
    std::vector<int> keep;
    if (r_.gpu_blobs >= 0) {
      keep.assign(order.begin(), order.begin() + r_.gpu_blobs);
      fill(EngineKind::Sliding, slots, keep);
    } else {
      fill(EngineKind::Sliding, slots, keep);
      if (p_.short_of.memory == Shortfall::Memory::Gpu) return;  // the GPU is short already
      for (int b : order) {                                      // keep each blob that still fits the GPU budget
        const Plan before = p_;
        keep.push_back(b);
        fill(EngineKind::Sliding, slots, keep);
        if (p_.short_of.memory == Shortfall::Memory::Gpu) {
          keep.pop_back();
          p_ = before;
        }
      }
    }
    slots = add_slots(slots, keep);
    to_disk(slots);
    add_copies(slots);
    add_hold(slots);
  }

  // More slots (PlanRequest::slots 0, training on a GPU): the GPU memory the placement leaves holds
  // more of the forward's last layers for the backward, each slot saving about one layer's second
  // upload a step (PCIe, and host-bus bytes the step's AdamW shares: session 17, OLMoE at 24 GiB,
  // 8 slots against 3: 22 uploads a step against 27, 1.037x the tokens/s). They cost GPU memory
  // only, after the blobs kept on the GPU (which save a blob's every transfer and its host AdamW):
  // the fewest slots that make the fewest uploads among the counts that fit (the counts come from
  // the slot policy itself, Plan::uploads_per_step; a count only falls as slots are added).
  // Returns the slot count.
  int add_slots(int slots, const std::vector<int>& keep) {
    if (r_.slots > 0 || !r_.training || on_host_ || p_.engine != EngineKind::Sliding ||
        p_.short_of.memory == Shortfall::Memory::Gpu)
      return slots;
    const Plan base = p_;
    auto fits = [&](int n) {
      fill(EngineKind::Sliding, n, keep);
      return p_.short_of.memory != Shortfall::Memory::Gpu;
    };
    // Beyond one slot a host blob nothing more is held.
    const int top = std::max(slots, int(lay_.blobs.size() - keep.size()));
    int lo = slots, hi = top + 1;  // fits(lo); hi: does not, or past the top
    while (lo + 1 < hi) {
      const int mid = (lo + hi) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    fits(lo);
    const int fewest = p_.uploads_per_step;
    if (lo == slots || fewest >= base.uploads_per_step) {
      p_ = base;
      return slots;
    }
    int a = slots, b = lo;  // uploads(a) > fewest, uploads(b) == fewest
    while (a + 1 < b) {
      const int mid = (a + b) / 2;
      fits(mid);
      (p_.uploads_per_step > fewest ? a : b) = mid;
    }
    fits(b);
    return b;
  }

  // Held gradients (PlanRequest::hold_grads 1): without clipping each host blob is updated as its
  // gradient lands, so the host has nothing to do in the forward and the head, and when its AdamW
  // is slower than the backward the step waits for it at the end of the backward. Holding the
  // blobs at the top of the forward order (their gradients land first, the next forward needs them
  // last) moves their updates into that idle time (SlidingOptions::hold_grads), and a share of each
  // held update can run as its gradient lands, while the host would wait for the first blob not
  // held (SlidingOptions::hold_early). How many and what share: the prediction's best over the
  // candidates (predict_sliding models the backward's saving, the held layers' landing time, and a
  // forward that would wait for a held update), the fastest that fits and is kMinGain shorter than
  // holding none. A requested count (hold_grads N > 1) or share (hold_early >= 0) is taken as it is.
  void add_hold(int slots) {
    if (r_.hold_grads == 0 || r_.clip || !r_.optimizer || on_host_ || !p_.fits || p_.disk_bytes > 0 || !r_.training ||
        p_.engine != EngineKind::Sliding)
      return;
    const bool count_given = r_.hold_grads > 1;
    Plan none = p_;
    none.hold_grads = 0;
    none.hold_early = 0;
    predict(s_, lay_, r_, be_, rates_, none);
    std::vector<double> shares;
    if (r_.hold_early >= 0)
      shares.push_back(std::min(r_.hold_early, 1.0));
    else
      for (int i = 0; i <= 10; ++i) shares.push_back(i / 10.0);
    // The candidates: held_grad_blobs' order (from the top), one blob more each, with each share.
    struct Candidate {
      double step_s;
      int64_t hold;
      double early;
    };
    std::vector<Candidate> cands;
    Plan trial = p_;
    auto consider = [&](int64_t held) {
      for (double x : shares) {
        trial.hold_grads = held;
        trial.hold_early = x;
        predict(s_, lay_, r_, be_, rates_, trial);
        cands.push_back({trial.step_s, held, x});
      }
    };
    if (count_given) {
      consider(r_.hold_grads);
    } else {
      const std::vector<bool> can = held_grad_blobs(lay_, p_.gpu_blobs, std::numeric_limits<int64_t>::max());
      int64_t held = 0;
      for (int b = int(can.size()) - 1; b >= 1; --b) {
        if (!can[size_t(b)]) continue;
        held += lay_.blobs[size_t(b)].numel;
        consider(held);
      }
    }
    // Fastest first (to the microsecond). Ties to the share nearest one half (the larger of two),
    // then more held parameters: where both phases are bound by the host, moving update work
    // between them keeps their sum and the prediction cannot tell the candidates apart, while early
    // work competes with the backward's landings and late work can stall the forward. Measured
    // (docs/DECISIONS.md, held updates): OLMoE-1B-7B at 24 GiB, ties 30-60 %: 40 % beat 30 %
    // (two runs each, one lease), every host layer at 50 % was session 17's fastest; 8B at 24 GiB,
    // ties 70-80 %: 70 % 8,337 tokens/s against 80 % 7,862 (one run each). Each fills the budgets
    // with its held gradients' pinned memory, or the next is tried.
    std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
      const int64_t ta = std::llround(a.step_s * 1e6), tb = std::llround(b.step_s * 1e6);  // to the microsecond
      const double da = std::abs(a.early - 0.5), db = std::abs(b.early - 0.5);
      if (ta != tb) return ta < tb;
      if (std::abs(da - db) > 1e-9) return da < db;
      return a.early != b.early ? a.early > b.early : a.hold > b.hold;
    });
    for (const Candidate& c : cands) {
      if (!count_given && !(c.step_s < none.step_s * (1 - kMinGain))) break;
      hold_ = c.hold;
      hold_early_ = c.early;
      fill(EngineKind::Sliding, slots, none.gpu_blobs, none.disk_blobs, none.ckpt_disk_layers, none.disk_masters,
           none.disk_weights, none.disk_grads);
      if (p_.fits) return;
    }
    hold_ = 0;
    hold_early_ = 0;
    p_ = none;
  }

  // Upload copies (PlanRequest::upload_copies Auto): a placement that fits with nothing in the
  // offload file may spend the host memory left on a working copy in the compute dtype beside each
  // host blob's fp32 master. Its uploads then carry act bytes a parameter instead of 4 (PCIe and
  // the host bus, twice a step) and its updates write act bytes more (the host bus once a step);
  // a bf16 copy is a split master's high half (HostOptimizer), which costs neither the writes nor
  // more than the tie bits' 1/8 byte a parameter of memory (the low halves leave the pinned budget).
  // Every host blob if the host budget holds them, else the most in forward order that it holds
  // (a binary search over the buffer lists); kept when the predicted step is kMinGain shorter
  // (the prediction is a lower bound). Only training with the optimizer, on a GPU computing below
  // fp32 (on the cpu backend a copy is a second master and saves nothing).
  void add_copies(int slots) {
    if (r_.upload_copies != CopiesChoice::Auto || !p_.fits || p_.disk_bytes > 0 || on_host_ || !r_.training ||
        !r_.optimizer || dtype_size(be_.compute_dtype) >= 4)
      return;
    Plan none = p_;
    predict(s_, lay_, r_, be_, rates_, none);
    const std::vector<int> keep = p_.gpu_blobs;
    auto with = [&](int n) {
      copies_ = n;
      fill(EngineKind::Sliding, slots, keep);
      return p_.fits;
    };
    const int most = int(lay_.blobs.size() - keep.size());
    int n = most;
    if (!with(most)) {
      int lo = 0, hi = most;  // with(lo) fits, with(hi) does not
      while (lo + 1 < hi) {
        const int mid = (lo + hi) / 2;
        (with(mid) ? lo : hi) = mid;
      }
      n = lo;
      if (n > 0) with(n);
    }
    if (n > 0) {
      predict(s_, lay_, r_, be_, rates_, p_);
      if (p_.step_s < none.step_s * (1 - kMinGain)) return;
    }
    copies_ = 0;
    p_ = none;
  }

  // Short of host memory with an offload directory: the NVMe tier (docs/ENGINE.md), in levels
  // by the disk traffic a step costs per byte of host memory freed, cheapest first:
  //   1. whole blobs' AdamW m and v (with the optimizer; disk_blob_order): read and written once a
  //      step, 2 bytes of traffic a byte freed;
  //   2. with clipping, the step's held gradients of those blobs (written as they land, read by the
  //      update): 2 bytes a byte freed, and they do not grow with the micro-batches;
  //   3. the checkpoints of the first layers (training): written in the forward, read in the
  //      backward, 2 bytes a byte freed (their traffic grows with the micro-batches);
  //   4. the fp32 masters of those blobs (with their state in the store): read and written with m
  //      and v, the uploads reading a working copy in the compute dtype kept in host memory: 8
  //      bytes a parameter for 2 freed (bf16), 4 a byte;
  //   5. their working copies too: written by the update, read for each of the two uploads a
  //      step: 6 bytes a parameter for 2 freed, 3 a byte (after 4, which it needs).
  // Each level takes the fewest blobs (layers) that fit, a binary search over the planner's own
  // buffer lists (host bytes fall with each one moved); the next level only when all of this
  // one do not.
  void to_disk(int slots) {
    if (r_.offload_dir.empty() || p_.short_of.memory != Shortfall::Memory::Host) return;
    // (On the cpu backend the "GPU" is host memory: keeping blobs there saves nothing.)
    const std::vector<int> keep = on_host_ ? std::vector<int>{} : p_.gpu_blobs;
    std::vector<int> cand;
    if (r_.optimizer)
      for (int b : disk_blob_order(s_))
        if (std::find(keep.begin(), keep.end(), b) == keep.end()) cand.push_back(b);
    const int nc = int(cand.size());
    // How many of each level: state blobs, held gradients, checkpoint layers, masters, working copies.
    enum { State, Grads, Ckpts, Masters, Weights, Levels };
    int level[Levels] = {0, 0, 0, 0, 0};
    const bool held = r_.clip || !r_.optimizer;  // the engine's keep_grads
    const int most[Levels] = {nc, held ? nc : 0, r_.training ? s_.n_layer : 0, nc, nc};
    auto first = [&](int n) { return std::vector<int>(cand.begin(), cand.begin() + std::ptrdiff_t(n)); };
    auto with = [&] {  // a working copy in the store needs its master there
      fill(EngineKind::Sliding, slots, keep, first(level[State]), level[Ckpts],
           first(std::max(level[Masters], level[Weights])), first(level[Weights]), first(level[Grads]));
      return p_.short_of.memory != Shortfall::Memory::Host;
    };
    for (int k = 0; k < Levels; ++k) {
      if (most[k] == 0) continue;
      const size_t before = p_.host_bytes;
      level[k] = most[k];
      if (with()) {
      } else if (k == Masters && p_.host_bytes >= before) {  // fp32 compute: a working copy is a master's size,
        level[k] = 0;                                        // so masters go only with their working copies
        continue;
      } else {
        continue;  // still short with all of this level: the next one too
      }
      int lo = 0, hi = most[k];  // with(hi) fits
      while (lo + 1 < hi) {
        level[k] = (lo + hi) / 2;
        (with() ? hi : lo) = level[k];
      }
      level[k] = hi;
      with();
      return;
    }
    // Short with everything in the store: refused as that (the last fill's numbers).
  }

  const ModelSpec& s_;
  const PlanRequest& r_;
  const BackendInfo& be_;
  const Rates& rates_;
  const bool on_host_;  // the cpu backend's "device" memory is host memory
  const ModelLayout lay_;
  Plan p_;
  int whole_ = 0, kept_ = 0;  // the placement's selective recompute (Plan::whole_layers, kept_layers)
  int copies_ = 0;            // the placement's upload copies: the first this many host blobs with state in RAM
  int64_t hold_ = 0;          // the placement's held gradients (Plan::hold_grads; add_hold)
  double hold_early_ = 0;     // the share of each held update run as it lands (Plan::hold_early; add_hold)
  struct Uploads {
    int count = 0;
    std::vector<int> backward;
  };
  std::map<std::vector<int>, Uploads> uploads_;  // count_uploads' replays: [kept blobs..., slots, keep_grads]
};

// Short of GPU memory with the sliding engine: smaller micro-batches, more of them (layer-major
// accumulation keeps the PCIe and host traffic of a step the same). The first that fits, if any.
// (When none fits and the smallest one fits the GPU, `p` becomes that one: its shortfall, e.g. of
// the offload directory, is the one to report.)
bool split_micro_batches(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates, Plan& p) {
  Plan last;
  for (int m = r.batch / 2; m >= 1; --m) {
    if (r.batch % m != 0) continue;
    PlanRequest q = r;
    q.batch = m;
    q.grad_accum = r.grad_accum * (r.batch / m);
    q.split_micro = false;
    Plan sub = make_plan(s, q, be, rates);
    if (sub.fits) {
      p = std::move(sub);
      return true;
    }
    last = std::move(sub);
  }
  if (last.micro_batch > 0 && last.short_of.memory != Shortfall::Memory::Gpu) p = std::move(last);
  return false;
}

// Host memory bytes a parameter of the host AdamW passes (cpu::adamw) move, with m and v of
// `state` bytes each and gradients of `act` bytes: the fused pass reads and writes p, m, v and
// reads g (24 + act with fp32 state, 16 + act with bf16); of the split update, the parameter pass
// reads p, m, v, g and writes p (16 + act; 12 + act), the moment pass reads g, m, v and writes m, v
// (16 + act; 8 + act). host_adamw_params_s was measured on the fused pass with fp32 state: the bus
// moves (24 + act) times that many bytes a second, whatever the state's dtype. A blob with an
// upload copy (Plan::upload_copies) has its fused or parameter pass write act bytes more a
// parameter (the copy; SlidingTraffic::Pc).
struct PassBytes {
  double fused, params, moments;
};
PassBytes pass_bytes(double act, double state) { return {8 + 4 * state + act, 8 + 2 * state + act, 4 * state + act}; }

// The sliding engine's step with clipping and the split update (SlidingOptions::split_update):
// each phase is bound by the GPU, by PCIe, or by the host memory bus, which the CPU passes and the
// DMA share (session 5: moving bytes from CPU passes to DMA, by running some layers' AdamW on the
// GPU with their state streamed through PCIe, made the step slower: DMA bytes cost the bus as
// much). Forward: the parameter passes (pass_bytes), the fp32 uploads, the checkpoints going
// down. Then the head, which waits for the last layer. Backward: the moment passes, the uploads
// again, the gradients down, the checkpoints up.
// The bus rate: the fused pass's 24 + act bytes a parameter at the host AdamW rate (measured
// beside the step's DMA), times 1.2: the CPU passes (with software prefetch) and the DMA together
// reach more (session 5, H200 machine: the 3B clipped forward moved 73.5 GB in ~0.47 s, ~156 GB/s,
// against 138 for the fused pass alone); 1.2 keeps the bound below. Sets p.host_s; the path.
// What the sliding step moves, as predict_sliding derives it.
struct SlidingTraffic {
  double P = 0;         // parameters updated on the host
  double Pc = 0;        // of which with an upload copy (written by the fused or parameter pass: + act bytes)
  double act = 0;       // bytes of a compute-dtype element
  double ckpt = 0;      // bytes of one micro-batch's checkpoints (every layer's input)
  double up = 0;        // bytes the forward's uploads read from host memory (upload_bytes_per_pass)
  double up_back = 0;   // bytes the backward's uploads read (Plan::backward_uploads)
  double up_fwd_s = 0;  // the forward's uploads at the PCIe rate
  double up_bwd_s = 0;  // the backward's uploads and checkpoint fetches
  bool emb_on_host = true;
};

// The step as three phases run one after the other: the forward (with the updates that overlap it),
// the head, and the backward (with what overlaps it); each its own bound.
struct Phases {
  PhaseTime fwd, head, bwd;
};

Phases split_update_path(const ModelSpec& s, const ModelLayout& lay, const PlanRequest& r, const Rates& rates,
                         const Flops& f, const SlidingTraffic& t, Plan& p) {
  const double P = t.P, Pc = t.Pc, act = t.act, ckpt = t.ckpt, up_fwd_s = t.up_fwd_s, up_bwd_s = t.up_bwd_s;
  const bool emb_on_host = t.emb_on_host;
  const double pcie = rates.pcie_gbs * 1e9;
  const PassBytes pb = pass_bytes(act, double(dtype_size(r.state_dtype)));
  const double bus = rates.host_bus_gbs > 0 ? rates.host_bus_gbs * 1e9 : rates.host_adamw_params_s * (24 + act) * 1.2;
  const double K = r.grad_accum;
  const double head_s = p.gpu_s * (f.head / f.total);
  const double layers_fwd_gpu = p.gpu_s * ((f.forward - f.head / 3) / f.total),
               layers_bwd_gpu = p.gpu_s * (1.0 - (f.forward + f.head * 2 / 3) / f.total);
  const double fwd_host = (P * pb.params + Pc * act + t.up + K * ckpt) / bus;
  const double fwd_pcie = std::max(up_fwd_s, K * ckpt / pcie);  // checkpoints go down
  const double bwd_host = (P * pb.moments + t.up_back + P * act + K * ckpt) / bus;
  // Two slots and a tied embedding on the host: the layers evict it, the head uploads it again.
  const double emb = double(lay.embedding().numel);
  const double head_upload_s = p.slots <= 2 && s.tie_embeddings && emb_on_host ? emb * 4 / pcie : 0.0;
  p.host_s = (P * (pb.params + pb.moments) + Pc * act) / (rates.host_adamw_params_s * (24 + act));
  Phases ph;
  ph.fwd.at_least(layers_fwd_gpu, Bound::Gpu);
  ph.fwd.at_least(fwd_host, Bound::Host);
  ph.fwd.at_least(fwd_pcie, Bound::Pcie);
  ph.head.at_least(head_s + head_upload_s, Bound::Gpu);
  ph.bwd.at_least(layers_bwd_gpu, Bound::Gpu);
  ph.bwd.at_least(bwd_host, Bound::Host);
  ph.bwd.at_least(up_bwd_s, Bound::Pcie);
  return ph;
}

// The NVMe tier's disk in the step's phases (docs/ENGINE.md "NVMe tier"). The disk's work is not
// free to fall anywhere in the step: a disk blob's region (m, v, and at the further levels its held
// gradient, master and working copy) is read and written around its update, so in the phase the
// updates run in (the forward with clipping, the backward without), except that a held gradient
// is written in the backward as it lands (and not written back) and a working copy is not read by
// the update but for each upload (the forward's, and the backward's unless a slot holds it); checkpoints are written in
// the forward and read in the backward. Only the state ring's read-ahead and write-behind (`disk_ring` blobs) can cross
// into the other phase, and only while the disk has nothing else to do there. So the disk's total time is a bound (the
// prediction before), and so is each phase's share: with --grad-accum 8 the 8B backward is ~12 s of GPU work in which
// the disk reads only the checkpoints of 11 layers, and the forward cannot absorb that idle time (session 7: disk
// busy 40.4 s of a 49.6 s step, the disk's total planned 38.7 s). And a phase bound by the disk ends with its last
// update, after which the schedule still has work that waits for it (`Tails`). `ph`: the phases without the disk;
// `act`: bytes of a working copy's element. The result: the phases at least as long as their disk work.
struct Tails {
  double layers_bwd_gpu = 0;  // the decoder layers' backward on the GPU (all micro-batches)
  // With clipping: what follows the last disk blob's update in the forward — its upload and the
  // forward of its layer and the layers above it (every micro-batch), which wait for that update.
  double fwd = 0;
  // Without clipping: what follows the last disk blob's update in the backward — the embedding's
  // host update, whose gradient lands after it (the next forward needs it first).
  double bwd = 0;
};
Phases with_disk(const ModelSpec& s, const ModelLayout& lay, const PlanRequest& r, const Rates& rates, double act,
                 const Tails& tails, Phases ph, Plan& p) {
  p.lent_read_bytes = p.lendable_bytes = 0;
  if (p.disk_bytes == 0) return ph;
  const double layers_bwd_gpu = tails.layers_bwd_gpu;
  const double rd = rates.disk_read_gbs * 1e9, wr = rates.disk_write_gbs * 1e9;
  // The file: the regions of p.disk_blobs (StateStream's layout) and the disk checkpoints.
  StateStream::Config sc;
  sc.numel.assign(lay.blobs.size(), 0);
  sc.master.assign(lay.blobs.size(), false);
  sc.work.assign(lay.blobs.size(), false);
  for (int b : p.disk_blobs) sc.numel[size_t(b)] = lay.blobs[size_t(b)].numel;
  for (int b : p.disk_masters) sc.master[size_t(b)] = true;
  for (int b : p.disk_weights) sc.work[size_t(b)] = true;
  sc.grads.assign(lay.blobs.size(), false);
  for (int b : p.disk_grads) sc.grads[size_t(b)] = true;
  sc.elem_bytes = dtype_size(r.state_dtype);
  sc.work_bytes = sc.grad_bytes = size_t(act);
  sc.order = p.disk_blobs;
  const double region = p.disk_blobs.empty() ? 0.0 : double(StateStream::store_bytes(sc));
  double work = 0, grads = 0;
  for (int b : p.disk_weights) work += double(NvmeStore::aligned(uint64_t(lay.blobs[size_t(b)].numel) * size_t(act)));
  double work_back = 0;  // of those, the backward's uploads (the slots hold the others from the forward)
  for (int b : p.backward_uploads)
    if (std::find(p.disk_weights.begin(), p.disk_weights.end(), b) != p.disk_weights.end())
      work_back += double(NvmeStore::aligned(uint64_t(lay.blobs[size_t(b)].numel) * size_t(act)));
  for (int b : p.disk_grads) grads += double(NvmeStore::aligned(uint64_t(lay.blobs[size_t(b)].numel) * size_t(act)));
  const double ckpt = std::max(0.0, double(p.disk_bytes) - region);
  // Around the updates: the regions read (less the working copies) and written (less the held
  // gradients); a held gradient written in the backward; one working-copy read in each phase; the
  // checkpoints.
  const double U = (region - work) / rd + (region - grads) / wr, W = work / rd, Wb = work_back / rd, Gw = grads / wr;
  const double Cw = ckpt / wr, Cr = ckpt / rd;
  // What the ring may move into the other phase: the reads and writes of as much of the regions as
  // its buffers hold (StateStream's "disk.ring": a few pieces, not whole blobs).
  double ring = 0;
  for (const MemoryItem& m : p.items)
    if (m.key == "disk.ring") ring += double(m.bytes);
  const double M = region > 0 ? std::min(U, U * ring / region) : 0.0;
  // With clipping, the ring also reads ahead into the host checkpoints the backward has consumed
  // (StateStream::lend): the next blobs in update order (forward order) after the ring's pieces,
  // layer l's checkpoints holding only pieces of blobs up to its own (l + 1), so a blob b needs
  // the checkpoints of layers b - 1 and above; the forward takes them back. Only reads move there
  // (the write-backs follow the updates). Greedy from the first blob: as much as fits.
  double lendable = 0;
  if (r.clip && p.lend_checkpoints && region > 0) {
    double host_ckpt = 0;  // K x (L - c) checkpoints in host memory
    for (const MemoryItem& m : p.items)
      if (m.key == "ckpt.host") host_ckpt += double(m.bytes);
    const int n_layer = s.n_layer, c_layers = std::clamp(p.ckpt_disk_layers, 0, n_layer);
    const double per_layer = n_layer > c_layers ? host_ckpt / double(n_layer - c_layers) : 0.0;
    std::vector<int> order = p.disk_blobs;
    std::sort(order.begin(), order.end());
    double skip = ring;  // the ring's own pieces come first
    for (int b : order) {
      const uint64_t n = uint64_t(lay.blobs[size_t(b)].numel);
      double read = 2.0 * double(NvmeStore::aligned(n * sc.elem_bytes));
      if (sc.master[size_t(b)]) read += double(NvmeStore::aligned(n * 4));
      if (sc.grads[size_t(b)]) read += double(NvmeStore::aligned(n * size_t(act)));
      const double in_ring = std::min(skip, read);
      skip -= in_ring;
      read -= in_ring;
      const double room = per_layer * double(n_layer - std::max(c_layers, b - 1));  // layers >= b - 1
      if (lendable + read > room) {
        lendable = std::max(lendable, room);
        break;
      }
      lendable += read;
    }
  }
  p.lendable_bytes = lendable;
  // The backward cannot finish its disk layers before their checkpoints are read: those reads start
  // with the backward (the store reads 4 fetches ahead, CheckpointStore::read_ahead), and the
  // layers whose checkpoints are in RAM come first.
  const double L = double(s.n_layer), c = double(p.ckpt_disk_layers), fetches = c * r.grad_accum;
  if (c > 0) {
    const double ahead = std::min(1.0, double(CheckpointOptions{}.read_ahead) / fetches);
    ph.bwd.at_least(layers_bwd_gpu * (L - c) / L + std::max(layers_bwd_gpu * c / L, Cr * (1 - ahead)), Bound::Disk);
  }
  if (r.clip) {
    // Updates in the forward: the regions' traffic, the checkpoint writes and the working copies'
    // reads there, less what the ring moves into the backward's spare disk time (the first pieces
    // read ahead, the last ones written behind), then the forward's layers after the last update.
    // (Held gradients in the store come with clipping only: written in the backward.)
    ph.bwd.at_least(Cr + Gw + Wb, Bound::Disk);
    const double spare = std::max(0.0, ph.bwd.s - Cr - Gw - Wb);
    const double ring_moved = std::min(M, spare), lent_moved = std::min(lendable / rd, spare - ring_moved);
    p.lent_read_bytes = lent_moved * rd;
    ph.fwd.at_least(U + Cw + W - ring_moved - lent_moved + tails.fwd, Bound::Disk);
  } else {
    // Updates in the backward as the gradients land: the regions there, less the read-ahead the
    // forward's spare disk time takes, then the embedding's update.
    ph.fwd.at_least(Cw + W, Bound::Disk);
    ph.bwd.at_least(U + Cr + Gw + Wb - std::min(M, std::max(0.0, ph.fwd.s - Cw - W)) + tails.bwd, Bound::Disk);
  }
  return ph;
}

}  // namespace

uint64_t upload_bytes_per_pass(const ModelSpec& s, const Plan& p, DType act) {
  return upload_bytes_per_pass(make_layout(s), p, act);
}

uint64_t upload_bytes_of(const ModelLayout& lay, const Plan& p, int b, DType act) {
  auto has = [b](const std::vector<int>& v) { return std::find(v.begin(), v.end(), b) != v.end(); };
  if (has(p.gpu_blobs)) return 0;  // kept: no upload
  const bool work = has(p.disk_masters) || has(p.upload_copies);
  return uint64_t(lay.blobs[size_t(b)].numel) * (work ? dtype_size(act) : 4);
}

uint64_t upload_bytes_per_pass(const ModelLayout& lay, const Plan& p, DType act) {
  uint64_t n = 0;
  for (size_t b = 0; b < lay.blobs.size(); ++b) n += upload_bytes_of(lay, p, int(b), act);
  return n;
}

namespace {

// The sliding engine's step time: a lower bound from the rates, assuming the schedule overlaps
// what it can.
void predict_sliding(const ModelSpec& s, const ModelLayout& lay, const PlanRequest& r, const BackendInfo& be,
                     const Rates& rates, const Flops& f, Plan& p) {
  double P = double(lay.total_numel());  // parameters updated on the host
  bool emb_on_host = true;
  for (int b : p.gpu_blobs) {
    P -= double(lay.blobs[size_t(b)].numel);
    emb_on_host &= b != 0;
  }
  const double pcie = rates.pcie_gbs * 1e9;
  const double act = double(dtype_size(be.compute_dtype));
  const double ckpt = double(s.n_layer) * double(r.batch) * r.seq * double(s.hidden) * act;
  // What one pass's uploads carry (fp32 masters, or working copies: of masters in the store, upload
  // copies): every host blob in the forward, in the backward those the slots no longer hold
  // (Plan::backward_uploads).
  const double up_pass = double(upload_bytes_per_pass(lay, p, be.compute_dtype));
  p.upload_bytes = up_pass;
  double up_back = 0;
  for (int b : p.backward_uploads) up_back += double(upload_bytes_of(lay, p, b, be.compute_dtype));
  p.upload_bytes_backward = up_back;
  // Parameters whose update also writes an upload copy beside an fp32 master (act bytes a
  // parameter more). A bf16 copy is a split master's high half instead (HostOptimizer): the
  // update writes its two halves where it wrote the fp32 master, nothing more.
  double Pc = 0;
  if (!upload_copy_splits(be.compute_dtype))
    for (int b : p.upload_copies) Pc += double(lay.blobs[size_t(b)].numel);
  // One fused pass (bf16 gradient in), bound by the bus: bf16 state moves fewer bytes.
  const double update_s = (P * pass_bytes(act, double(dtype_size(r.state_dtype))).fused + Pc * act) /
                          (rates.host_adamw_params_s * (24 + act));
  p.host_s = update_s;
  // Layer-major micro-batches: weights cross PCIe once a step each pass (fp32 up, cast on the GPU,
  // or a working copy in the compute dtype; twice, forward and backward) and gradients once
  // (compute dtype down), whatever grad_accum is.
  const double up = up_pass + up_back + r.grad_accum * ckpt, down = P * act + r.grad_accum * ckpt;
  p.pcie_s = std::max(up, down) / pcie;
  // With clipping the update waits for the backward and overlaps only the next forward (in
  // forward order). Without, each blob's update runs during the backward, but the embedding's
  // comes last and the next forward needs it first.
  // Each phase is at least as long as its own uploads (a layer's fp32 weights can outlast its
  // compute: 8B's forward is PCIe-bound at 24 GiB); checkpoints go down in the forward and come
  // back up in the backward.
  const double up_fwd_s = up_pass / pcie, up_bwd_s = (up_back + r.grad_accum * ckpt) / pcie;
  const double gpu_fwd = p.gpu_s * (f.forward / f.total), gpu_bwd = p.gpu_s * (1.0 - f.forward / f.total);
  const double emb_update_s = emb_on_host ? update_s * double(lay.embedding().numel) / P : 0.0;
  Phases ph;  // the head is inside the forward and the backward here
  ph.fwd.at_least(gpu_fwd, Bound::Gpu);
  ph.fwd.at_least(up_fwd_s, Bound::Pcie);
  double bwd_host = p.host_s;
  if (!r.clip && p.hold_grads > 0) {
    // Held gradients (SlidingOptions::hold_grads: blobs from the top of the forward order). Their
    // updates run from the next forward's start, in forward order; the forward reaches layer l
    // after l layers' time and cannot pass a held blob before its update is done, so it lasts at
    // least (the held updates up to blob b) + (the forward from b on), for every held b. The
    // backward's host work loses theirs but starts only when the first blob not held lands, after
    // the held layers' backward.
    const std::vector<bool> held = held_grad_blobs(lay, p.gpu_blobs, p.hold_grads);
    const double L = double(s.n_layer), per_param = update_s / P;
    const double layer_fwd = std::max(gpu_fwd, up_fwd_s) / L, layer_bwd = std::max(gpu_bwd, up_bwd_s) / L;
    // A share x of each held update (SlidingOptions::hold_early) runs as its gradient lands: the
    // forward keeps the rest, and the backward's host work starts with the first blob not held or
    // when the held shares are done, whichever is later.
    const double x = std::clamp(p.hold_early, 0.0, 1.0);
    double held_s = 0, held_layers = 0, fwd_host = 0;
    for (size_t b = 1; b < held.size(); ++b) {
      if (!held[b]) continue;
      held_s += double(lay.blobs[b].numel) * per_param;
      const double layer = std::min(double(b) - 1, L);  // blob 1 + l is layer l; the head comes after L
      held_layers += b + 1 < held.size() ? 1 : 0;
      fwd_host = std::max(fwd_host, (1 - x) * held_s + (L - layer) * layer_fwd);
    }
    ph.fwd.at_least(fwd_host, Bound::Host);
    // The held updates share the host memory bus with the forward's uploads (session 14, OLMoE:
    // the layers' forward 15.6 -> 18-20 ms, PCIe-bound, while they ran).
    const double bus = rates.host_bus_gbs > 0 ? rates.host_bus_gbs * 1e9 : rates.host_adamw_params_s * (24 + act) * 1.2;
    ph.fwd.at_least((1 - x) * held_s * rates.host_adamw_params_s * (24 + act) / bus + up_pass / bus, Bound::Host);
    bwd_host = std::max(held_layers * layer_bwd, x * held_s) + p.host_s - held_s;
  }
  ph.bwd.at_least(gpu_bwd + emb_update_s, Bound::Gpu);
  ph.bwd.at_least(up_bwd_s + emb_update_s, Bound::Pcie);
  ph.bwd.at_least(bwd_host + emb_update_s, Bound::Host);
  if (r.clip && r.split_update) {
    ph = split_update_path(s, lay, r, rates, f, {P, Pc, act, ckpt, up_pass, up_back, up_fwd_s, up_bwd_s, emb_on_host},
                           p);
  } else if (r.clip) {
    ph.fwd.at_least(update_s, Bound::Host);
    ph.bwd = {};
    ph.bwd.at_least(gpu_bwd, Bound::Gpu);
    ph.bwd.at_least(up_bwd_s, Bound::Pcie);
  }
  // The NVMe store: every byte of the offload file is written once and read once a step (the state
  // around its update, whatever grad_accum is; the checkpoints, which grow with it), working copies
  // read once more (Plan::disk_read_bytes, disk_write_bytes); the phases bound where that traffic
  // can fall (with_disk).
  if (p.disk_bytes > 0)
    p.disk_s = p.disk_read_bytes / (rates.disk_read_gbs * 1e9) + p.disk_write_bytes / (rates.disk_write_gbs * 1e9);
  Tails tails;
  tails.layers_bwd_gpu = p.gpu_s * (1.0 - (f.forward + f.head * 2 / 3) / f.total);
  if (!p.disk_blobs.empty()) {
    // The disk blobs are layers; with clipping they are updated in forward order, so the highest
    // is the last, and its layer and those above it run their forward after its update.
    const int last = *std::max_element(p.disk_blobs.begin(), p.disk_blobs.end());
    const bool work = std::find(p.disk_masters.begin(), p.disk_masters.end(), last) != p.disk_masters.end();
    const double layers_fwd_gpu = p.gpu_s * ((f.forward - f.head / 3) / f.total);
    tails.fwd = double(lay.blobs[size_t(last)].numel) * (work ? act : 4.0) / pcie +
                layers_fwd_gpu * double(s.n_layer - (last - 1)) / double(s.n_layer);
    tails.bwd = emb_update_s;
  }
  ph = with_disk(s, lay, r, rates, act, tails, ph, p);
  p.forward = ph.fwd;
  p.head = ph.head;
  p.backward = ph.bwd;
  const double phases = ph.fwd.s + ph.head.s + ph.bwd.s;
  p.step_s = phases;
  p.step_by = Bound::Phases;
  for (auto [t, by] : {std::pair{p.host_s, Bound::Host}, {p.pcie_s, Bound::Pcie}, {p.disk_s, Bound::Disk}})
    if (t > p.step_s) {
      p.step_s = t;
      p.step_by = by;
    }
}

void predict(const ModelSpec& s, const ModelLayout& lay, const PlanRequest& r, const BackendInfo& be,
             const Rates& rates, Plan& p) {
  const double tokens = double(r.batch) * r.seq * r.grad_accum;
  p.flops =
      (flops_per_token(s, r.seq).total - recompute_flops_saved_per_token(s, r.seq, p.whole_layers, p.kept_layers)) *
      tokens;
  // GPU time from the work (attention at its own rates); its forward / head / backward shares
  // split the sliding engine's phases. Selective recompute removes backward work only: the shares
  // are taken against the total without it (the forward and the head keep theirs).
  Flops f = gpu_work_per_token(s, r.seq, rates);
  f.total -= recompute_saved_per_token(s, r.seq, p.whole_layers, p.kept_layers, work_weights(s, rates));
  p.gpu_s = f.total * tokens / (rates.model_tflops * 1e12);
  if (p.engine == EngineKind::Resident)
    p.step_s = p.gpu_s;
  else
    predict_sliding(s, lay, r, be, rates, f, p);
  p.tokens_per_s = tokens / p.step_s;
  if (be.kind == DeviceKind::Cpu) {  // the rates are a GPU machine's
    p.step_s = p.gpu_s = p.host_s = p.pcie_s = p.tokens_per_s = 0;
    p.forward = p.head = p.backward = {};
  }
}

}  // namespace

Plan make_plan(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates) {
  if (r.batch <= 0) setting_error(Setting::BatchSize, "must be positive");
  if (r.seq <= 0) setting_error(Setting::SeqLen, "must be positive");
  if (r.grad_accum <= 0) setting_error(Setting::GradAccum, "must be positive");
  if (r.slots != 0 && r.slots < 2)
    setting_error(Setting::Slots, "the sliding engine needs at least 2 GPU parameter slots");
  // More slots than blobs hold nothing: bounded by the model (a huge --slots once ran a minute).
  if (r.slots > int(gpu_blob_order(s).size()))
    setting_error(Setting::Slots, std::to_string(r.slots) + " is more than the model's " +
                                      std::to_string(gpu_blob_order(s).size()) + " blobs");
  if (r.gpu_blobs > int(gpu_blob_order(s).size()))
    setting_error(Setting::GpuBlobs, "the model has " + std::to_string(gpu_blob_order(s).size()) + " blobs");
  if (r.whole_layers < -1 || r.whole_layers > s.n_layer)
    setting_error(Setting::KeepLayers, std::to_string(r.whole_layers) + " is not a layer count from 0 to the model's " +
                                           std::to_string(s.n_layer) + " layers");
  if (r.kept_layers < -1 || r.kept_layers > s.n_layer - std::max(r.whole_layers, 0))
    setting_error(Setting::KeepAttention, std::to_string(r.kept_layers) +
                                              " is not a layer count from 0 to the model's " +
                                              std::to_string(s.n_layer) + " layers less those kept whole");
  Plan p = Planner(s, r, be, rates).choose();
  if (p.engine == EngineKind::Sliding && p.short_of.memory == Shortfall::Memory::Gpu && r.split_micro) {
    Plan sub;
    if (split_micro_batches(s, r, be, rates, sub)) return sub;
    if (sub.micro_batch > 0) return sub;  // short of something else than the GPU even so (predicted)
  }
  predict(s, make_layout(s), r, be, rates, p);
  return p;
}

std::string plan_summary(const Plan& p) {
  std::string s =
      std::string("plan: ") + engine_name(p.engine) + " engine" +
      (p.engine == EngineKind::Sliding ? ", " + std::to_string(p.slots) + " GPU slots, " +
                                             std::to_string(p.gpu_blobs.size()) + " blobs kept on the GPU"
                                       : std::string()) +
      (p.micro_batch > 0
           ? "; micro-batches of " + std::to_string(p.micro_batch) + " x " + std::to_string(p.micro_batches) + " a step"
           : std::string()) +
      (p.whole_layers > 0 ? "; " + std::to_string(p.whole_layers) + " layers kept whole" : std::string()) +
      (p.kept_layers > 0 ? "; attention kept in " + std::to_string(p.kept_layers) + " layers" : std::string()) +
      (p.upload_copies.empty() ? std::string()
                               : "; upload copies of " + std::to_string(p.upload_copies.size()) + " blobs") +
      (p.hold_grads > 0 ? "; gradients of " + std::to_string(p.hold_grads) + " parameters held for the next forward" +
                              (p.hold_early > 0 ? " (" + std::to_string(int(std::lround(p.hold_early * 100))) +
                                                      " % of each update as it lands)"
                                                : std::string())
                        : std::string()) +
      "; device " + format_bytes(p.gpu_bytes) + ", host " + format_bytes(p.host_bytes) + " (" +
      format_bytes(p.pinned_bytes) + " pinned)";
  if (p.tokens_per_s > 0) s += "; predicted at best " + std::to_string(int64_t(p.tokens_per_s)) + " tokens/s";
  return s;
}

std::string format_phases(const Plan& p) {
  char line[256];
  std::snprintf(line, sizeof line, "phases: forward %.3f s (%s), head %.3f s (%s), backward %.3f s (%s); the step: %s",
                p.forward.s, bound_name(p.forward.by), p.head.s, bound_name(p.head.by), p.backward.s,
                bound_name(p.backward.by),
                p.step_by == Bound::Phases ? "their sum" : (std::string(bound_name(p.step_by)) + "'s total").c_str());
  return line;
}

std::string format_plan(const ModelSpec& s, const PlanRequest& r, const Plan& p, SettingNamer names) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "plan: %s, %.2fB parameters, %d x %d tokens x %d micro-batches a step%s\n",
                s.architecture.c_str(), double(s.total_params()) / 1e9, p.micro_batch, r.seq, p.micro_batches,
                p.micro_batch != r.batch ? " (batches split to fit the GPU)" : "");
  o << line;
  const std::string recompute = p.whole_layers + p.kept_layers > 0
                                    ? "of " + std::to_string(s.n_layer) + " layers, " + std::to_string(p.whole_layers) +
                                          " kept whole: no recompute; " + std::to_string(p.kept_layers) +
                                          " keep attention's output: their recompute skips attention"
                                    : "";
  o << "engine: " << engine_name(p.engine)
    << (p.engine == EngineKind::Sliding
            ? " (" + std::to_string(p.slots) + " GPU slots, " + std::to_string(p.gpu_blobs.size()) +
                  " blobs kept whole on the GPU" + (recompute.empty() ? "" : "; " + recompute) +
                  (recompute.empty() || p.micro_batches <= 1 ? "" : ", kept for each micro-batch") + ")"
        : recompute.empty() ? ""
                            : " (" + recompute + ")")
    << "\n";
  for (Place where : {Place::Device, Place::Pinned, Place::Host, Place::Disk}) {
    const size_t n = total_bytes(p.items, where);
    if (n == 0) continue;
    o << (where == Place::Device   ? "GPU memory"
          : where == Place::Pinned ? "host, pinned"
          : where == Place::Host   ? "host, pageable"
                                   : "offload dir " + r.offload_dir)
      << ": " << format_bytes(n) << "\n";
    for (const MemoryItem& m : p.items) {
      if (m.place != where) continue;
      std::snprintf(line, sizeof line, "  %12s  %s\n", format_bytes(m.bytes).c_str(), m.name.c_str());
      o << line;
    }
  }
  o << "budgets: GPU " << (p.gpu_budget ? format_bytes(p.gpu_budget) : std::string("unknown")) << ", host "
    << (p.host_budget ? format_bytes(p.host_budget) : std::string("unknown"))
    << (r.offload_dir.empty() ? std::string() : ", offload dir " + format_bytes(p.disk_budget)) << "\n";
  if (p.disk_bytes > 0) {  // the NVMe tier's levels (docs/ENGINE.md), and its traffic a step
    std::snprintf(line, sizeof line,
                  "offload dir holds: AdamW state of %zu blobs, held gradients of %zu, checkpoints of %d layers, "
                  "fp32 masters of %zu, working copies of %zu; a step reads %s and writes %s there\n",
                  p.disk_blobs.size(), p.disk_grads.size(), p.ckpt_disk_layers, p.disk_masters.size(),
                  p.disk_weights.size(), format_bytes(size_t(p.disk_read_bytes)).c_str(),
                  format_bytes(size_t(p.disk_write_bytes)).c_str());
    o << line;
    if (p.lendable_bytes > 0) {
      std::snprintf(line, sizeof line,
                    "read ahead into the checkpoints the backward freed: %s of AdamW state (room for %s)\n",
                    format_bytes(size_t(p.lent_read_bytes)).c_str(), format_bytes(size_t(p.lendable_bytes)).c_str());
      o << line;
    }
  }
  if (p.engine == EngineKind::Sliding) {  // upload copies, and what a pass's uploads carry
    const size_t host_blobs = gpu_blob_order(s).size() - p.gpu_blobs.size();
    if (p.upload_copies.empty())
      std::snprintf(line, sizeof line, "upload copies: none (%s %s)\n", names(Setting::UploadCopies),
                    copies_choice_name(r.upload_copies));
    else
      std::snprintf(line, sizeof line, "upload copies: %zu of %zu host blobs, %s pinned (%s %s)\n",
                    p.upload_copies.size(), host_blobs, format_bytes(p.upload_copy_bytes).c_str(),
                    names(Setting::UploadCopies), copies_choice_name(r.upload_copies));
    o << line;
    if (r.training) {
      std::snprintf(line, sizeof line,
                    "uploads: %d a step; the forward's carry %s, the backward's %s (%zu blobs; the slots hold the "
                    "forward's last %zu)\n",
                    p.uploads_per_step, format_bytes(size_t(p.upload_bytes)).c_str(),
                    format_bytes(size_t(p.upload_bytes_backward)).c_str(), p.backward_uploads.size(),
                    host_blobs - std::min(host_blobs, p.backward_uploads.size()));
    } else {
      std::snprintf(line, sizeof line, "uploads: a pass carries %s\n", format_bytes(size_t(p.upload_bytes)).c_str());
    }
    o << line;
  }
  o << (p.fits ? "fits" : "DOES NOT FIT: " + p.why(names)) << "\n";
  if (p.step_s > 0) {
    char disk[48] = "";
    if (p.disk_s > 0) std::snprintf(disk, sizeof disk, ", disk %.3f s", p.disk_s);
    std::snprintf(line, sizeof line,
                  "predicted (lower bound from the rates): %.3f s a step, %.0f tokens/s (GPU %.3f s, host %.3f s, "
                  "PCIe %.3f s%s)\n",
                  p.step_s, p.tokens_per_s, p.gpu_s, p.host_s, p.pcie_s, disk);
    o << line;
    if (p.engine == EngineKind::Sliding) o << format_phases(p) << "\n";
  }
  return o.str();
}

int longest_seq_len(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates, int max_seq) {
  auto fits = [&](int T) {
    PlanRequest q = r;
    q.seq = T;
    return make_plan(s, q, be, rates).fits;
  };
  if (max_seq < 1 || !fits(1)) return 0;
  int lo = 1, hi = max_seq;  // lo fits; the answer is in [lo, hi]
  if (fits(hi)) return hi;
  while (hi - lo > 1) {  // lo fits, hi does not
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace sf

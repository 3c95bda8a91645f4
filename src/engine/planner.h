// The planner (docs/ARCHITECTURE.md §4): from the model, the batch and the memory budgets, which engine runs,
// with how many GPU slots, what every buffer costs on the GPU and in host memory, whether it
// fits, and a predicted step time from measured rates. Nothing is allocated; the buffers are the
// engines' own lists (engine/buffers.h), from which their constructors allocate
// (tests/test_engine_buffers.cpp counts the allocations).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/error.h"
#include "engine/buffers.h"
#include "engine/sliding_engine.h"
#include "model/spec.h"

namespace sf {

// Buffers of each engine, one item a line of `slideformer plan` (the engine's list,
// ResidentEngine::buffers / SlidingEngine::buffers, with the items of one name summed) for max_batch x max_seq
// micro-batches (the resident engine holds gradients only when training, AdamW state only with the optimizer; the
// sliding one always both: sliding_memory, after Plan).
// The resident engine's list for options o (shape, micro-batches, training, optimizer, state
// dtype, selective recompute's whole_layers and kept_layers) at the backend's sizes.
std::vector<MemoryItem> resident_memory(const ModelSpec& s, const EngineOptions& o, const BackendInfo& be);
// The order in which the planner moves blobs' AdamW state to the NVMe store: the layers, last
// first (the embedding's and the head's updates stay in host memory: without clipping the
// embedding's is the last of a backward and the next forward needs it first).
std::vector<int> disk_blob_order(const ModelSpec& s);
// The order in which the planner keeps blobs whole on the GPU: the embedding (the largest, and the
// last to be updated in a backward while the next forward needs it first), the head, then layers.
std::vector<int> gpu_blob_order(const ModelSpec& s);

// Rates the prediction uses. Defaults: measured on the H200 machine (docs/PERFORMANCE.md):
// the 1B in-memory step's effective rate over the model's FLOPs, bench_host's CPU AdamW and host
// read rate, PCIe with both directions busy.
struct Rates {
  // GPU, bf16: a whole step's rate over its matrix + attention FLOPs at sequences of
  // kRateSeqLen tokens (where it was measured: the H200's 1B and 3B steps at 8 x 2048).
  double model_tflops = 510;
  // The causal attention kernel alone, forward and backward, on FLOPs counted FlashAttention's way
  // (attention_forward_flops; the backward 2.5x the forward), at head dim 128 and long sequences.
  // Attention's FLOPs beyond (or short of) those of kRateSeqLen-token sequences run at these rates
  // (gpu_seconds_per_token). Defaults: the H200 machine's sm_90 kernels (persistent forward,
  // session 11 on) at `plan --measure`'s shape (B 2, T 8192, 32/8 heads of 128: the long sequences
  // these rates price): session 23's kernels (the instruction trims; sessions 13-22's measured
  // forward 605-633, backward 424-449; bench/results/*_t_all.log, *_gpu_tests.log "attention
  // forward").
  double attn_fwd_tflops = 657;
  double attn_bwd_tflops = 524;
  // CPU AdamW (fused pass, bf16 gradients), all cores in dynamic pieces, with the DMA of a step
  // running: the H200 machine's 3B step without clipping, 3.21 B parameters in 610 ms (session 4)
  double host_adamw_params_s = 5.3e9;
  double host_read_gbs = 75;  // host memory read, all cores
  double pcie_gbs = 44;       // each way, both directions busy
  // The host memory bus with the CPU's optimizer passes and the DMA both busy; 0: derived from the
  // host AdamW rate (its fused pass's bytes x 1.2, planner.cpp split_update_path).
  double host_bus_gbs = 0;
  // The NVMe store's disk (--offload-dir), O_DIRECT large blocks, several requests in flight. The
  // defaults are the H200 machine's disk with one request in flight (issue 17's figures).
  double disk_read_gbs = 1.77;
  double disk_write_gbs = 2.44;
};

// The sequence length at which Rates::model_tflops is measured (the step's attention at that length
// is inside it).
constexpr int kRateSeqLen = 2048;
// Causal attention's forward FLOPs, FlashAttention's count: QK^T and PV over the T/2 keys a query
// sees on average, 4 x B x T x (T/2) x n_head x head_dim (the backward: 2.5x this).
double attention_forward_flops(int64_t B, int64_t T, int64_t n_head, int64_t head_dim);

enum class OffloadChoice { Auto, On, Off };
// Upload copies (SlidingOptions::upload_copies): the planner's choice, every host blob, or none.
enum class CopiesChoice { Auto, On, Off };
const char* copies_choice_name(CopiesChoice c);  // "auto" | "on" | "off"

struct PlanRequest {
  int batch = 1, seq = 1;
  int grad_accum = 1;
  bool training = true, optimizer = true;  // eval needs neither gradients nor AdamW state
  bool clip = true;  // gradient clipping (the sliding engine's update then waits for the backward)
  OffloadChoice offload = OffloadChoice::Auto;
  int slots = 0;           // 0: the planner's choice
  int gpu_blobs = -1;      // sliding: blobs kept whole on the GPU (the first of gpu_blob_order); -1: all that fit
  size_t gpu_budget = 0;   // bytes the engine may hold on the GPU (0: the backend's free memory)
  size_t host_budget = 0;  // bytes of host memory (0: MemAvailable)
  // The NVMe tier: where the offload file may go (empty: no disk) and how much of it (0: the free
  // space of the directory's filesystem less 5 %).
  std::string offload_dir;
  size_t disk_budget = 0;
  bool split_micro = true;   // the planner may split micro-batches to fit the GPU
  bool split_update = true;  // with clipping, the update in two passes (SlidingOptions::split_update)
  // The state ring reads ahead into the host checkpoints the backward has consumed
  // (SlidingOptions::lend_checkpoints; docs/ENGINE.md "Read-ahead into freed checkpoints").
  bool lend_checkpoints = true;
  // Without clipping, gradients held for the next forward (SlidingOptions::hold_grads): 0 none, 1 as
  // many as the prediction says pay (Planner::add_hold), N > 1 that many parameters. make_engine
  // asks for 1 unless SF_HOLD_GRADS says otherwise (docs/DECISIONS.md, "Held gradients").
  int64_t hold_grads = 0;
  // Of each held update, the share run as its gradient lands (SlidingOptions::hold_early): -1 the
  // planner's choice with the count (Planner::add_hold), 0..1 that share. SF_HOLD_EARLY.
  double hold_early = -1;
  DType state_dtype = DType::F32;  // AdamW m and v (EngineOptions::state_dtype): 4 or 2 bytes each
  // How checkpoints in the offload file move, as choose_checkpoint_io (io/gds.h) decided at
  // start-up: the cuFile library (GPUDirect Storage: no pinned ring), or empty (io_uring + pinned
  // bounce buffers). The engine is built with the plan's (Plan::ckpt_cufile).
  std::string ckpt_cufile;
  // Selective recompute (EngineOptions::whole_layers, kept_layers): layers kept whole (no
  // recompute) and layers keeping attention's output. -1: the planner's choice (on a GPU, resident:
  // attention kept in every layer the budget has room for, then as many of them kept whole as the
  // rest allows; sliding: the count among 0..L whole, attention in none or all of the rest, whose
  // placement — blobs kept on the GPU fill what it leaves — has the fastest predicted step; none
  // on the cpu backend), N: that many (sliding: per micro-batch, blobs kept on the GPU after them).
  int whole_layers = -1;
  int kept_layers = -1;
  // Upload copies (sliding engine): Auto, after a placement fits with nothing in the offload file,
  // a working copy in the compute dtype beside the fp32 master of every host blob (or of the first
  // ones in forward order, as many as the host budget holds) when the predicted step is at least
  // 1 % shorter (training on a GPU whose compute dtype is below fp32 only); On: every host blob
  // whose state is in host memory; Off: none.
  CopiesChoice upload_copies = CopiesChoice::Auto;
};

enum class EngineKind { Resident, Sliding };
const char* engine_name(EngineKind k);  // "resident" | "sliding" (the CLI's and the JSON's word)

// Why a plan does not fit, as data: which memory, what the plan needs, what the budget allows
// (and, for host memory, how much of the need is page-locked).
struct Shortfall {
  enum class Memory { None, Gpu, Host, Disk };
  Memory memory = Memory::None;
  size_t needs = 0, available = 0, pinned = 0;
  size_t kept = 0;    // GPU: of `needs`, selective recompute's kept activations (named in the phrase)
  size_t copies = 0;  // host: of `needs`, what the upload copies add (named in the phrase)
  // "needs X of GPU memory, Y available (<the GPU memory setting>)"; empty when None.
  SettingText phrase() const;
  std::string text(SettingNamer names = setting_name) const { return phrase().render(names); }
  std::optional<Setting> setting() const;  // the budget that is short (GpuMemory, HostMemory, DiskMemory)
};

// What bounds a predicted time: the GPU's compute, PCIe, the host (AdamW passes, the host memory
// bus), the NVMe store's disk, or (for the step) the sum of its phases.
enum class Bound { Gpu, Pcie, Host, Disk, Phases };
const char* bound_name(Bound b);  // "GPU" | "PCIe" | "host" | "disk" | "phases"
struct PhaseTime {
  double s = 0;
  Bound by = Bound::Gpu;
  // At least t seconds, which `r` needs.
  void at_least(double t, Bound r) {
    if (t > s) {
      s = t;
      by = r;
    }
  }
};

struct Plan {
  EngineKind engine = EngineKind::Resident;
  int slots = 0;
  std::vector<int> gpu_blobs;     // sliding: blobs kept whole on the GPU
  int64_t hold_grads = 0;         // sliding without clipping: SlidingOptions::hold_grads
  double hold_early = 0;          // and SlidingOptions::hold_early (0 when nothing is held)
  std::vector<int> disk_blobs;    // sliding: blobs whose AdamW state is in the NVMe store
  int ckpt_disk_layers = 0;       // sliding: the first layers whose checkpoints are in the NVMe store
  std::vector<int> disk_masters;  // sliding: of disk_blobs, those whose fp32 master is in the store too
  std::vector<int> disk_weights;  // sliding: of disk_masters, those whose working copy is too (read per upload)
  std::vector<int> disk_grads;    // sliding, clipping: of disk_blobs, those whose held gradient waits there
  // sliding: host blobs (state in host memory) whose uploads read a working copy in the compute
  // dtype beside their fp32 master (SlidingOptions::upload_copies), and those copies' bytes
  std::vector<int> upload_copies;
  size_t upload_copy_bytes = 0;
  std::string ckpt_cufile;       // PlanRequest::ckpt_cufile: checkpoints on disk through cuFile (no pinned ring)
  bool lend_checkpoints = true;  // PlanRequest::lend_checkpoints
  // Selective recompute, training (both engines; the sliding engine's per micro-batch): layers kept
  // whole (EngineOptions::whole_layers) and layers keeping attention's output (kept_layers).
  int whole_layers = 0;
  int kept_layers = 0;
  // The micro-batches the engine runs: micro_batches of micro_batch sequences a step. The request's
  // batch x grad_accum, unless the sliding engine only fits the GPU with smaller micro-batches
  // (smaller workspace and activations; the same step, as the loss is normalised per step).
  int micro_batch = 0, micro_batches = 0;
  std::vector<MemoryItem> items;
  size_t gpu_bytes = 0, pinned_bytes = 0, host_bytes = 0;  // host_bytes counts pinned too
  size_t disk_bytes = 0;                                   // the offload file
  // The store's traffic a step: everything in it is written once and read once (state around the
  // update, checkpoints), and the working copies are read once more (two uploads a step).
  double disk_read_bytes = 0, disk_write_bytes = 0;
  // With clipping, of the reads before the updates: the bytes read ahead into host checkpoints the
  // backward has consumed (lent_read_bytes, as many as the backward's idle disk time takes), and
  // the most the freed checkpoints could hold (lendable_bytes): moved out of the forward.
  double lent_read_bytes = 0, lendable_bytes = 0;
  size_t gpu_budget = 0, host_budget = 0, disk_budget = 0;
  bool fits = false;
  Shortfall short_of;  // when it does not fit
  std::string why(SettingNamer names = setting_name) const { return short_of.text(names); }
  // Prediction (seconds a step of batch x seq x grad_accum tokens).
  double flops = 0;  // per optimizer step
  double gpu_s = 0, host_s = 0, pcie_s = 0, step_s = 0;
  double disk_s = 0;        // the NVMe store's reads and writes of a step at the disk's rates
  double upload_bytes = 0;  // sliding: what one pass's uploads carry up PCIe (upload_bytes_per_pass)
  // Sliding, training: a step's uploads as the slot policy makes them (SlidingEngine::pass_uploads):
  // how many, and the blobs the backward uploads again (those the forward's last slots do not hold).
  int uploads_per_step = 0;
  std::vector<int> backward_uploads;
  double upload_bytes_backward = 0;  // what those carry up PCIe (the prediction's)
  double tokens_per_s = 0;
  // Sliding: the step's three phases one after the other as the engine schedules them (the
  // forward with the updates that overlap it — with clipping every host update —, the head, the
  // backward with the updates that overlap it — without clipping, those as gradients land), each
  // at least what its busiest resource needs there (PhaseTime::by). step_s is their sum unless a
  // resource's whole-step total is longer (step_by).
  PhaseTime forward, head, backward;
  Bound step_by = Bound::Gpu;  // Phases: the phases' sum; else the resource whose total sets the step
};

// The sliding engine's options for a plan's placement (slots, blobs kept on the GPU, held
// gradients, the NVMe levels, the checkpoints' I/O path) over `base` (batch, sequence,
// micro-batches, state dtype); keep_grads: the step's gradients held in host memory (clipping,
// or gradients read back). The one copy from a Plan: the planner sums the buffers of these options
// and make_engine builds the engine with them.
SlidingOptions sliding_options(const Plan& p, const EngineOptions& base, bool keep_grads);
// The sliding engine's buffers with options o at the backend's sizes (what the planner sums).
std::vector<MemoryItem> sliding_memory(const ModelSpec& s, const SlidingOptions& o, const BackendInfo& be);
// The same from the model's layout (built once by the caller).
std::vector<MemoryItem> sliding_memory(const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o,
                                       const BackendInfo& be);

// Model FLOPs per trained token of one training step (matrix products, 2 per multiply-add, and
// causal attention; MoE layers on their active parameters: router + top_k experts): forward +
// backward (3x the forward), plus the decoder layers' recomputed forward when with_recompute
// (what the GPU executes; the planner's compute model). MFU uses it without the recompute.
double train_flops_per_token(const ModelSpec& s, int T, bool with_recompute);
// FLOPs a trained token saves by selective recompute (EngineOptions::whole_layers, kept_layers):
// a layer kept whole skips its recompute (its matrix products, 2 x the parameters it multiplies
// there, and attention); a layer keeping attention's output skips attention's forward, QK^T and PV
// over the keys each query sees (4 x q_dim x keys: 2 x T x q_dim for a causal layer of T tokens).
double recompute_flops_saved_per_token(const ModelSpec& s, int T, int whole_layers, int kept_layers);

// The GPU seconds a trained token costs in one training step (forward, recompute, backward; no
// layer kept from the forward): the step's FLOPs at kRateSeqLen-token sequences at the model rate,
// their attention taken out at the attention kernel's rates and attention at T put in at them
// (docs/ENGINE.md, "Prediction"). At T = kRateSeqLen this is the step's FLOPs / model_tflops.
double gpu_seconds_per_token(const ModelSpec& s, int T, const Rates& rates);

// Bytes the uploads of one pass (every host blob once) carry up PCIe in a sliding plan: a blob's
// fp32 master (4 bytes a parameter, cast on the GPU), or, when its master is in the NVMe store
// (Plan::disk_masters, levels 4-5) or it has an upload copy (Plan::upload_copies), its working
// copy in the compute dtype `act`, which the slot cache copies as it is. Blobs kept on the GPU
// upload nothing.
uint64_t upload_bytes_per_pass(const ModelSpec& s, const Plan& p, DType act);
uint64_t upload_bytes_per_pass(const ModelLayout& lay, const Plan& p, DType act);
// What one upload of blob b carries in that plan (0: kept on the GPU).
uint64_t upload_bytes_of(const ModelLayout& lay, const Plan& p, int b, DType act);

// The plan for a CUDA (or CPU) backend. Throws InputError for impossible requests (slots < 2).
Plan make_plan(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates = {});
// The longest sequence (tokens a row, 1..max_seq) whose plan fits the request's budgets with its
// other settings (batch, micro-batches, engine choice, ...), by bisection: every placement's memory
// grows with the sequence. 0 when not even 1 token fits. `plan --longest-seq`.
int longest_seq_len(const ModelSpec& s, const PlanRequest& r, const BackendInfo& be, const Rates& rates, int max_seq);
// One line: engine, memory, predicted rate.
std::string plan_summary(const Plan& p);
// "phases: forward 28.991 s (disk), head 0.769 s (GPU), backward 10.019 s (GPU); the step: their sum"
// (the sliding engine's Plan::forward, head, backward and step_by).
std::string format_phases(const Plan& p);
// Human-readable, one item a line.
// `names`: how the shortfall names the budget that is short (the CLI: its options).
std::string format_plan(const ModelSpec& s, const PlanRequest& r, const Plan& p, SettingNamer names = setting_name);

}  // namespace sf

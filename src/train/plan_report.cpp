#include "train/plan_report.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "engine/disk_rate.h"
#include "engine/make_engine.h"
#include "engine/rates.h"
#include "io/gds.h"
#include "io/json_file.h"
#include "train/hardware_profile.h"
#include "train/presets.h"
#include "train/train_options_check.h"

namespace sf {

namespace {

constexpr double kGiB = double(size_t(1) << 30);

double mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemTotal:") return double(kb) * 1024.0;
  return 0;
}

// The rates the prediction uses and where they come from.
struct RateSource {
  Rates rates;
  std::string source = "built-in (the H200 machine)";
  std::optional<HardwareProfile> hardware;  // --hardware
};

// This machine's figures as a hardware file: what `plan --measure` found; what it could not
// measure (no GPU, no --offload-dir) is the built-in default, and its source says so.
HardwareProfile measured_profile(const MeasuredRates& m, const BackendInfo& be, const std::optional<DiskRate>& disk) {
  const Rates def;
  HardwareProfile h;
  char host[256] = "this machine";
  ::gethostname(host, sizeof host - 1);
  h.name = host;
  h.description = "measured by `slideformer plan --measure`";
  const std::string measured = "measured by plan --measure";
  const bool gpu = m.gemm_tflops > 0;
  const std::string no_gpu = "not measured (no GPU): the built-in H200 figure";
  h.gpu_memory_gib = gpu && be.device_total > 0 ? double(be.device_total) / kGiB : 139.8;
  h.sources["gpu_memory_gib"] = gpu && be.device_total > 0 ? "cudaMemGetInfo total" : no_gpu;
  h.gemm_tflops = gpu ? m.gemm_tflops : def.model_tflops / kStepEfficiency;
  h.sources["gemm_tflops"] = gpu ? measured + " ([8192, 4096] x [4096, 4096]^T bf16, 10 in a row)" : no_gpu;
  h.model_efficiency = kStepEfficiency;
  h.sources["model_efficiency"] = "the H200 machine's 1B step over its layer GEMM rate (500 / 727)";
  h.attention_fwd_tflops = gpu ? m.rates.attn_fwd_tflops : def.attn_fwd_tflops;
  h.attention_bwd_tflops = gpu ? m.rates.attn_bwd_tflops : def.attn_bwd_tflops;
  h.sources["attention_fwd_tflops"] = h.sources["attention_bwd_tflops"] =
      gpu ? measured + " (our causal attention kernel, B 2 x T 8192, 32/8 heads of 128, FlashAttention's FLOP count)"
          : no_gpu;
  h.pcie_gbs = gpu ? m.rates.pcie_gbs : def.pcie_gbs;
  h.sources["pcie_gbs"] = gpu ? measured + " (256 MiB pinned, both directions at once)" : no_gpu;
  h.ram_gib = mem_total_bytes() / kGiB;
  h.sources["ram_gib"] = "MemTotal of /proc/meminfo";
  h.host_adamw_gparams_s = m.rates.host_adamw_params_s * 1e-9;
  h.sources["host_adamw_gparams_s"] = measured + " (32M parameters, all cores, no DMA running)";
  h.host_read_gbs = m.rates.host_read_gbs;
  h.sources["host_read_gbs"] = measured + " (squared norm of 128 MiB, all cores)";
  // The planner's own derivation (planner.cpp split_update_path): the fused pass's bytes x 1.2.
  h.host_bus_gbs = m.rates.host_adamw_params_s * (24 + 2) * 1.2 * 1e-9;
  h.sources["host_bus_gbs"] = "derived: host AdamW rate x 26 bytes a parameter x 1.2 (as the planner derives it)";
  h.disk_read_gbs = disk ? disk->read_gbs : def.disk_read_gbs;
  h.disk_write_gbs = disk ? disk->write_gbs : def.disk_write_gbs;
  const std::string d = disk ? measured + " (O_DIRECT, sequential, --offload-dir)"
                             : "not measured (no --offload-dir): the H200 machine's disk";
  h.sources["disk_read_gbs"] = h.sources["disk_write_gbs"] = d;
  if (disk) {
    h.disk_gib = disk->free_bytes / kGiB;
    h.sources["disk_gib"] = "free space under --offload-dir when measured";
  }
  return h;
}

RateSource rates_for(const PlanCliOptions& o, const BackendInfo& be) {
  RateSource rs;
  if (!o.hardware.empty()) {
    rs.hardware = load_hardware(o.hardware);
    const HardwareProfile& h = *rs.hardware;
    rs.rates = h.rates();
    rs.source = "hardware " + o.hardware;
    const std::string named = h.name.empty() || h.name == o.hardware ? "" : " (" + h.name + ")";
    log_info(
        "hardware %s%s: GPU %.1f GiB, RAM %.0f GiB, GEMM %.0f TFLOP/s -> model %.0f TFLOP/s, attention "
        "forward %.0f / backward %.0f TFLOP/s%s, PCIe %.1f GB/s, host AdamW %.2f G params/s, host bus %.0f GB/s, "
        "disk read %.2f / write %.2f GB/s",
        o.hardware.c_str(), named.c_str(), h.gpu_memory_gib, h.ram_gib, h.gemm_tflops, rs.rates.model_tflops,
        rs.rates.attn_fwd_tflops, rs.rates.attn_bwd_tflops,
        h.attention_fwd_tflops > 0 && h.attention_bwd_tflops > 0 ? "" : " (not in the file: from the GEMM rate)",
        h.pcie_gbs, h.host_adamw_gparams_s, h.host_bus_gbs, h.disk_read_gbs, h.disk_write_gbs);
    return rs;
  }
  if (!o.measure) return rs;
  const MeasuredRates m = measure_rates(o.device);
  rs.rates = m.rates;
  rs.source = "measured";
  std::string summary = m.summary;
  std::optional<DiskRate> disk;
  const std::string& dir = o.engine.offload_dir;
  if (!dir.empty()) {
    disk = measure_disk(dir, disk_probe_options_from_env());
    rs.rates.disk_read_gbs = disk->read_gbs;
    rs.rates.disk_write_gbs = disk->write_gbs;
    char line[256];
    std::snprintf(line, sizeof line, ", disk (%s) write %.2f GB/s, read %.2f GB/s (O_DIRECT, %s each way)",
                  dir.c_str(), disk->write_gbs, disk->read_gbs, format_bytes(disk->bytes_written).c_str());
    summary += line;
  }
  log_info("%s", summary.c_str());
  if (!o.save_hardware.empty()) {
    save_hardware(o.save_hardware, measured_profile(m, be, disk));
    log_info("wrote %s", o.save_hardware.c_str());
  }
  return rs;
}

// The trade of a larger step: predicted rate and memory for grad-accum K = 1, 2, 4, 8, 16 (one
// plan each; the planner is arithmetic over buffer lists, well under a second for 123B).
nlohmann::json grad_accum_table(const ModelSpec& spec, const PlanRequest& r, const BackendInfo& be, const Rates& rates,
                                SettingNamer names, std::string& text) {
  nlohmann::json rows = nlohmann::json::array();
  char line[256];
  std::snprintf(line, sizeof line, "by gradient accumulation (%d x %d tokens a micro-batch):\n", r.batch, r.seq);
  text = line;
  std::snprintf(line, sizeof line, "  %4s %12s %9s %10s %12s %12s %7s  %s\n", "K", "tokens/step", "step s", "tokens/s",
                "host memory", "disk", "disk s", "forward / backward s (bound)");
  text += line;
  for (int k : {1, 2, 4, 8, 16}) {
    PlanRequest q = r;
    q.grad_accum = k;
    const Plan p = make_plan(spec, q, be, rates);
    const double tokens = double(r.batch) * r.seq * k;
    rows.push_back({{"grad_accum", k},
                    {"tokens_per_step", tokens},
                    {"fits", p.fits},
                    {"predicted_step_s", p.step_s},
                    {"predicted_tokens_per_second", p.tokens_per_s},
                    {"host_bytes", p.host_bytes},
                    {"disk_bytes", p.disk_bytes},
                    {"predicted_disk_s", p.disk_s},
                    {"predicted_phases", phases_json(p)}});
    char phases[96] = "";
    if (p.engine == EngineKind::Sliding && p.step_s > 0)
      std::snprintf(phases, sizeof phases, "  %.3f (%s) / %.3f (%s)", p.forward.s, bound_name(p.forward.by),
                    p.backward.s, bound_name(p.backward.by));
    if (p.fits)
      std::snprintf(line, sizeof line, "  %4d %12.0f %9.3f %10.0f %12s %12s %7.3f%s\n", k, tokens, p.step_s,
                    p.tokens_per_s, format_bytes(p.host_bytes).c_str(), format_bytes(p.disk_bytes).c_str(), p.disk_s,
                    phases);
    else
      std::snprintf(line, sizeof line, "  %4d %12.0f  does not fit: %s\n", k, tokens, p.why(names).c_str());
    text += line;
  }
  return rows;
}

// The upper bound of --longest-seq's search: --seq-len when given, else the model's context
// (max_position_embeddings; a sliding window bounds it too), within the step-size limits.
int longest_seq_cap(const ModelSpec& spec, const PlanCliOptions& o) {
  int64_t cap = o.seq_len > 0 ? o.seq_len : spec.max_position > 0 ? spec.max_position : StepLimits::kMaxSeqLen;
  if (spec.sliding_window > 0) cap = std::min<int64_t>(cap, spec.sliding_window);
  cap = std::min(cap, StepLimits::kMaxSeqLen);
  cap = std::min(cap, StepLimits::kMaxStepTokens / (int64_t(o.batch_size) * std::max(o.grad_accum, 1)));
  return int(std::max<int64_t>(cap, 1));
}

}  // namespace

nlohmann::json phases_json(const Plan& p) {
  if (p.engine != EngineKind::Sliding || p.step_s <= 0) return nullptr;
  return {{"forward_s", p.forward.s},
          {"forward_bound", bound_name(p.forward.by)},
          {"head_s", p.head.s},
          {"head_bound", bound_name(p.head.by)},
          {"backward_s", p.backward.s},
          {"backward_bound", bound_name(p.backward.by)},
          {"step_bound", bound_name(p.step_by)}};
}

namespace {

// A sliding plan bound by the host with fp32 AdamW moments: the same plan with bf16 moments (4
// bytes a parameter less through the host's AdamW, memory and bus; m and v stochastically
// rounded), printed when it fits and predicts at least 1 % more tokens/s, and returned as
// {"setting", "value", "predicted_tokens_per_second", "predicted_step_s"}; else null. The
// numerics are the user's choice, so the plan only names it (session 24: 3B at 24 GiB with
// clipping, 1.09-1.10x measured on the H200 machine).
nlohmann::json faster_with(const ModelSpec& spec, const PlanRequest& r, const BackendInfo& be, const Rates& rates,
                           const Plan& p, SettingNamer names) {
  const auto host = [](const PhaseTime& t) { return t.by == Bound::Host; };
  if (!p.fits || p.engine != EngineKind::Sliding || p.step_s <= 0 || r.state_dtype != DType::F32 ||
      !(host(p.forward) || host(p.head) || host(p.backward) || p.step_by == Bound::Host))
    return nullptr;
  PlanRequest alt = r;
  alt.state_dtype = DType::BF16;
  const Plan q = make_plan(spec, alt, be, rates);
  if (!q.fits || q.step_s <= 0 || q.tokens_per_s < p.tokens_per_s * 1.01) return nullptr;
  std::fprintf(stderr,
               "faster with bf16 AdamW moments (the host bounds part of the step; m and v stochastically rounded, "
               "4 bytes a parameter less): %s bf16 predicts %.0f tokens/s (%.2fx)\n",
               names(Setting::OptimizerState), q.tokens_per_s, q.tokens_per_s / p.tokens_per_s);
  return {{"setting", names(Setting::OptimizerState)},
          {"value", "bf16"},
          {"predicted_tokens_per_second", q.tokens_per_s},
          {"predicted_step_s", q.step_s}};
}

}  // namespace

nlohmann::json run_plan(const PlanCliOptions& o) {
  const int sources = int(!o.model_dir.empty()) + int(!o.preset.empty()) + int(!o.config.empty());
  if (sources != 1) input_error("plan", "give one of --model DIR, --preset NAME or --config FILE");
  if (!o.hardware.empty() && o.measure)
    input_error("plan", "give --hardware (another machine's figures) or --measure (this machine's), not both");
  if (!o.save_hardware.empty() && !o.measure)
    input_error("--save-hardware", "needs --measure (it writes this machine's measured figures)");
  if (!o.save_hardware.empty() && std::filesystem::exists(std::filesystem::symlink_status(o.save_hardware)))
    input_error(o.save_hardware, "exists; --save-hardware does not overwrite a file (remove it or choose another name)");
  if (!o.hardware.empty() && o.device == "cpu")
    input_error("--hardware", "a hardware profile plans for its GPU; leave out --device cpu");
  std::string where = o.preset.empty() ? "" : "preset " + o.preset;
  nlohmann::json cfg;
  if (!o.preset.empty()) {
    cfg = preset_config(o.preset);
  } else {
    where = o.model_dir.empty() ? o.config : (std::filesystem::path(o.model_dir) / "config.json").string();
    cfg = read_json_file(where);
  }
  const ModelSpec spec = parse_model_spec(cfg, where);
  spec.check_seq_len(o.seq_len, where);
  EngineOptions eo;
  eo.max_batch = o.batch_size;
  eo.max_seq = o.seq_len;
  EngineRequest er = o.engine;
  er.device = o.hardware.empty() ? o.device : "cuda";
  er.grad_accum = o.grad_accum;
  er.clip = o.max_grad_norm > 0;
  PlanRequest r = plan_request(eo, er);
  // Another machine's GPU: the cuda backend's sizes (known without a GPU) and the profile's memory.
  BackendInfo be = o.hardware.empty() ? plan_backend(eo, er) : cuda_backend_sizes();
  const RateSource rs = rates_for(o, be);
  if (rs.hardware) {
    be.device_total = be.device_free = size_t(rs.hardware->gpu_memory_gib * kGiB);
    if (r.gpu_budget == 0) r.gpu_budget = rs.hardware->gpu_budget_bytes();
    if (r.host_budget == 0) r.host_budget = rs.hardware->host_budget_bytes();
    if (r.disk_budget == 0 && !r.offload_dir.empty()) r.disk_budget = rs.hardware->disk_budget_bytes();
  }
  // How checkpoints on disk would move (the same choice a run makes at start-up, make_engine.cpp
  // build_engine), before the plan, which counts that path's buffers. For another machine's
  // profile the pinned bounce is counted (cuFile needs none: the larger figure).
  std::string ckpt_io;
  if (!r.offload_dir.empty()) {
    if (rs.hardware) {
      ckpt_io = "decided on that machine at start-up: cuFile where libcufile loads (no pinned ring), else io_uring + "
                "pinned bounce (counted here)";
    } else {
      const CheckpointIo io = choose_checkpoint_io(be.kind == DeviceKind::Cuda, r.offload_dir, env_text(Env::Cufile));
      if (io.cufile) r.ckpt_cufile = io.library;
      ckpt_io = io.text;
    }
  }
  // --longest-seq: the longest sequence that fits, then its plan.
  std::string longest_text;
  int longest = -1;
  if (o.longest_seq) {
    const int cap = longest_seq_cap(spec, o);
    longest = longest_seq_len(spec, r, be, rs.rates, cap);
    r.seq = std::max(longest, 1);
    std::string stop = "the search's upper bound";
    if (longest < cap) {
      PlanRequest next = r;
      next.seq = longest + 1;
      const Plan over = make_plan(spec, next, be, rs.rates);
      stop = "at " + std::to_string(longest + 1) + " the plan " + over.why(o.names) +
             (over.short_of.memory == Shortfall::Memory::Gpu
                  ? " with the planner's GPU headroom of max(256 MiB, 1 %) beside it"
                  : "");
    }
    longest_text = longest > 0 ? "longest sequence that fits: " + std::to_string(longest) +
                                     " tokens a row (searched 1.." + std::to_string(cap) + "; " + stop + ")\n"
                               : "no sequence fits these budgets (not even 1 token a row): the plan for 1 follows\n";
  }
  const Plan p = make_plan(spec, r, be, rs.rates);
  std::fputs(longest_text.c_str(), stderr);
  std::fputs(format_plan(spec, r, p, o.names).c_str(), stderr);
  if (!r.offload_dir.empty()) {
    std::fprintf(stderr, "checkpoint I/O: %s%s\n", ckpt_io.c_str(),
                 p.ckpt_disk_layers > 0 ? "" : " (no checkpoint is on disk in this plan)");
  }
  const nlohmann::json faster = faster_with(spec, r, be, rs.rates, p, o.names);
  nlohmann::json table = nlohmann::json::array();
  if (p.step_s > 0) {
    std::string text;
    table = grad_accum_table(spec, r, be, rs.rates, o.names, text);
    std::fputs(text.c_str(), stderr);
  }
  nlohmann::json items = nlohmann::json::array();
  for (const MemoryItem& m : p.items)
    items.push_back({{"name", m.name},
                     {"bytes", m.bytes},
                     {"place", m.place == Place::Device   ? "gpu"
                               : m.place == Place::Pinned ? "pinned"
                               : m.place == Place::Host   ? "host"
                                                          : "disk"}});
  nlohmann::json out = {{"fits", p.fits},
                        {"why", p.why(o.names)},
                        {"engine", engine_name(p.engine)},
                        {"slots", p.slots},
                        {"micro_batch", p.micro_batch},
                        {"micro_batches", p.micro_batches},
                        {"hold_grads", p.hold_grads},
                        {"hold_early", p.hold_early},
                        {"gpu_blobs", p.gpu_blobs},
                        {"whole_layers", p.whole_layers},
                        {"kept_layers", p.kept_layers},
                        {"disk_blobs", p.disk_blobs},
                        {"ckpt_disk_layers", p.ckpt_disk_layers},
                        {"disk_masters", p.disk_masters},
                        {"disk_weights", p.disk_weights},
                        {"disk_grads", p.disk_grads},
                        {"disk_bytes", p.disk_bytes},
                        {"disk_read_bytes_per_step", p.disk_read_bytes},
                        {"disk_write_bytes_per_step", p.disk_write_bytes},
                        {"disk_read_ahead_lent_bytes", p.lent_read_bytes},
                        {"upload_bytes_per_pass", p.upload_bytes},
                        {"uploads_per_step", p.uploads_per_step},
                        {"upload_bytes_backward", p.upload_bytes_backward},
                        {"upload_copies", p.upload_copies},  // host blobs whose uploads read a working copy
                        {"upload_copy_bytes", p.upload_copy_bytes},
                        {"upload_copies_choice", copies_choice_name(r.upload_copies)},
                        {"disk_budget", p.disk_budget},
                        {"predicted_disk_s", p.disk_s},
                        {"checkpoint_io", ckpt_io},
                        {"backend", device_kind_name(be.kind)},
                        {"optimizer_state", r.state_dtype == DType::BF16 ? "bf16" : "fp32"},
                        {"parameters", spec.total_params()},
                        {"gpu_bytes", p.gpu_bytes},
                        {"host_bytes", p.host_bytes},
                        {"pinned_bytes", p.pinned_bytes},
                        {"gpu_budget", p.gpu_budget},
                        {"host_budget", p.host_budget},
                        {"flops_per_step", p.flops},
                        {"predicted_step_s", p.step_s},
                        {"predicted_tokens_per_second", p.tokens_per_s},
                        {"predicted_gpu_s", p.gpu_s},
                        {"predicted_host_s", p.host_s},
                        {"predicted_pcie_s", p.pcie_s},
                        {"predicted_phases", phases_json(p)},
                        {"faster_with", faster},
                        {"grad_accum_table", table},
                        {"rates",
                         {{"measured", o.measure},
                          {"source", rs.source},
                          {"model_tflops", rs.rates.model_tflops},
                          {"attn_fwd_tflops", rs.rates.attn_fwd_tflops},
                          {"attn_bwd_tflops", rs.rates.attn_bwd_tflops},
                          {"host_adamw_params_s", rs.rates.host_adamw_params_s},
                          {"host_read_gbs", rs.rates.host_read_gbs},
                          {"host_bus_gbs", rs.rates.host_bus_gbs},
                          {"pcie_gbs", rs.rates.pcie_gbs},
                          {"disk_read_gbs", rs.rates.disk_read_gbs},
                          {"disk_write_gbs", rs.rates.disk_write_gbs}}},
                        {"items", items}};
  out["seq_len"] = r.seq;
  if (o.longest_seq) out["longest_seq_len"] = longest;
  return out;
}

}  // namespace sf

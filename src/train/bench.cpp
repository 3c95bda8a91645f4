#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/device.h"
#include "backend/op_profile.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "engine/make_engine.h"
#include "engine/planner.h"
#include "io/json_file.h"
#include "train/plan_report.h"
#include "train/presets.h"
#include "train/step_fit.h"

namespace sf {

nlohmann::json run_bench(const BenchOptions& o) {
  if (o.batch_size <= 0 || o.seq_len <= 0) input_error("--batch-size/--seq-len", "must be positive");
  if (o.steps <= 0) input_error("--steps", "must be positive");
  if (o.grad_accum <= 0) input_error("--grad-accum", "must be positive");
  nlohmann::json cfg = o.config.empty() ? preset_config(o.preset) : read_json_file(o.config);
  if (o.layers > 0) cfg["num_hidden_layers"] = o.layers;
  ModelSpec spec = parse_model_spec(cfg, o.config.empty() ? "preset " + o.preset : o.config);
  EngineOptions eo;
  eo.max_batch = o.batch_size;
  eo.max_seq = o.seq_len;
  EngineRequest er = o.engine;
  er.device = o.device;
  er.clip = o.max_grad_norm > 0;
  er.grad_accum = o.grad_accum;
  er.profile_ops = o.profile_ops;
  check_step_fits(spec, eo, er);  // the step's size against what the plan can hold
  BuiltEngine built = build_engine(spec, eo, er);
  const std::unique_ptr<Device>& dev = built.dev;
  Engine& engine = *built.engine;
  log_info("%s", plan_summary(built.plan).c_str());
  PhaseTimes& setup = built.setup;  // plan, device, engine; then the weights
  {
    PhaseClock clock(setup);
    engine.init_random(1);
    clock.mark("random weights");
  }
  auto format_seconds = [](double secs) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f s", secs);
    return std::string(buf);
  };
  std::string setup_text;
  nlohmann::json setup_json = nlohmann::json::object();
  for (const auto& [name, secs] : setup.phases) {
    setup_text += (setup_text.empty() ? "" : ", ") + name + " " + format_seconds(secs);
    setup_json[name] = secs;
  }
  log_info("set-up: %s in all (%s)", format_seconds(setup.total()).c_str(), setup_text.c_str());
  log_info("bench: %s, %.2fB parameters, %d x %d tokens x %d micro-batches per step, %s, engine holds %s",
           spec.architecture.c_str(), double(spec.total_params()) / 1e9, o.batch_size, o.seq_len, o.grad_accum,
           dev->name().c_str(), format_bytes(engine.device_bytes()).c_str());

  // Random tokens, every position trained.
  std::mt19937_64 rng(2);
  std::vector<Record> recs(size_t(o.batch_size));
  for (auto& r : recs) {
    r.ids.resize(size_t(o.seq_len));
    for (auto& id : r.ids) id = int32_t(rng() % uint64_t(spec.vocab));
    r.labels = r.ids;
  }
  if (o.max_grad_norm < 0) input_error("--max-grad-norm", "must be >= 0");
  // The trainer's step (train/trainer.cpp): grad_accum batches, each as the plan's micro-batches.
  const int M = built.plan.micro_batch > 0 ? built.plan.micro_batch : o.batch_size;
  std::vector<Batch> mbs;
  for (int j = 0; j < o.grad_accum; ++j)
    for (int i = 0; i < o.batch_size; i += M) {
      std::vector<const Record*> group;
      for (int k = i; k < std::min(o.batch_size, i + M); ++k) group.push_back(&recs[size_t(k)]);
      mbs.push_back(make_batch(group, o.seq_len));
    }
  const Batch& b = mbs.front();
  auto step = [&](int64_t s) {
    Engine::StepParams sp;
    sp.adamw.lr = 1e-5f;
    sp.adamw.step = s + 1;
    sp.max_grad_norm = o.max_grad_norm;
    return engine.step(mbs, sp).loss;  // the update may still run when the next step starts
  };
  double loss = 0, first_loss = NAN;
  for (int64_t s = 0; s < o.warmup; ++s) {
    loss = step(s);
    if (s == 0) first_loss = loss;
  }
  engine.synchronize();
  auto* prof = dynamic_cast<ProfiledDevice*>(dev.get());
  if (prof) prof->reset();  // the warm-up steps' ops are not counted
  const Engine::Stats st0 = engine.stats();
  // Two figures. Steady state: a step's time is the interval between the returns of consecutive
  // steps (step() returns once the loss and norm are known; the update may still run and the next
  // forward waits for it blob by blob), averaged over the measured steps after the first — the
  // rate of a long run, comparable to PyTorch's per-step median. End to end: from the first
  // measured step's start, on a drained pipeline, to the last step's update drained, divided by
  // the steps (it counts one whole update more than the steady state does).
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  std::vector<clock::time_point> returned;
  for (int64_t s = 0; s < o.steps; ++s) {
    loss = step(o.warmup + s);
    if (std::isnan(first_loss)) first_loss = loss;
    returned.push_back(clock::now());
  }
  engine.synchronize();
  const auto t_end = clock::now();
  const double secs = std::chrono::duration<double>(t_end - t0).count();
  const double drain_s = std::chrono::duration<double>(t_end - returned.back()).count();
  const double steady_s =
      o.steps >= 2 ? std::chrono::duration<double>(returned.back() - returned.front()).count() / double(o.steps - 1)
                   : secs;
  const Engine::Stats st1 = engine.stats();
  const double per = 1.0 / double(o.steps);
  const double step_tokens = double(o.batch_size) * b.T * o.grad_accum;
  const double tps = step_tokens / steady_s;
  log_info(
      "bench: %.1f ms/step, %.0f tokens/s (steady state); end to end %.1f ms/step (the last update's %.0f ms "
      "drained); loss %.4f",
      1e3 * steady_s, tps, 1e3 * secs * per, 1e3 * drain_s, loss);
  // Model FLOPs (engine/planner.h train_flops_per_token: MoE layers on their active parameters)
  // over the steady step time; MFU against the bf16 dense peak of an H100/H200 (989 TFLOP/s), the
  // GPUs the numbers are taken on, null elsewhere. With the recompute: what the GPU ran (less the
  // recompute that layers kept whole or with attention's output skip).
  const double mfu_tflops = train_flops_per_token(spec, b.T, false) * step_tokens / steady_s * 1e-12;
  const double hw_tflops =
      (train_flops_per_token(spec, b.T, true) -
       recompute_flops_saved_per_token(spec, b.T, built.plan.whole_layers, built.plan.kept_layers)) *
      step_tokens / steady_s * 1e-12;
  const std::string dev_name = dev->name();
  const bool hopper = dev_name.find("H100") != std::string::npos || dev_name.find("H200") != std::string::npos;
  int64_t active = spec.vocab * spec.hidden * (spec.tie_embeddings ? 1 : 2) + spec.hidden;
  for (int l = 0; l < spec.n_layer; ++l) active += spec.layer_active_params(l);
  // Issue 19's measure: 8 N FLOPs a token (N: active parameters; forward, backward and a recompute
  // counted whether it runs or not) against the H200's measured GEMM peak (OpCeilings::matrix_flops,
  // `plan --measure`'s cuBLASLt rate), beside what the GPU executed against the same peak.
  const double gemm_peak_tflops = OpCeilings{}.matrix_flops * 1e-12;
  const double mfu_8n = 8.0 * double(active) * tps * 1e-12 / gemm_peak_tflops;
  const double executed_of_peak = hw_tflops / gemm_peak_tflops;
  char peak_note[160] = "";
  if (hopper)
    std::snprintf(peak_note, sizeof peak_note,
                  ", MFU %.3f; of the measured GEMM peak (%.0f TFLOP/s): 8N %.1f %%, executed %.1f %%",
                  mfu_tflops / 989.0, gemm_peak_tflops, 100 * mfu_8n, 100 * executed_of_peak);
  log_info("bench: %.1f model TFLOP/s (%.1f with the recompute)%s, %.2fB active parameters", mfu_tflops, hw_tflops,
           peak_note, double(active) / 1e9);
  nlohmann::json profile;
  if (prof) {
    prof->collect();
    const OpCeilings ceil;
    log_info("%s", prof->table(ceil, o.steps, steady_s).c_str());
    profile = prof->json(ceil, o.steps, steady_s);
  }
  return {{"tokens_per_second", tps},
          {"setup_s", setup.total()},  // plan, device, engine buffers and random weights, before the first step
          {"setup_phases", setup_json},
          {"step_ms", 1e3 * steady_s},
          {"end_to_end_step_ms", 1e3 * secs * per},
          {"end_to_end_tokens_per_second", step_tokens / (secs * per)},
          {"drain_ms", 1e3 * drain_s},
          {"steps", o.steps},
          {"batch_size", o.batch_size},
          {"grad_accum", o.grad_accum},
          {"micro_batch", M},
          {"micro_batches", mbs.size()},
          {"seq_len", o.seq_len},
          {"parameters", spec.total_params()},
          {"device", dev->name()},
          {"engine", engine_name(built.plan.engine)},
          {"slots", built.plan.slots},
          {"gpu_blobs", built.plan.gpu_blobs.size()},
          {"whole_layers", built.plan.whole_layers},
          {"kept_layers", built.plan.kept_layers},
          {"predicted_tokens_per_second", built.plan.tokens_per_s},
          {"predicted_step_ms", 1e3 * built.plan.step_s},
          {"predicted_phases", phases_json(built.plan)},  // forward / head / backward and their bounds
          {"max_grad_norm", o.max_grad_norm},
          {"optimizer_state", o.engine.state_dtype == DType::BF16 ? "bf16" : "fp32"},
          {"device_bytes", engine.device_bytes()},
          // host work a step (the sliding engine): AdamW; uploads of blobs; memory held
          {"host_update_ms", 1e3 * (st1.host_update_s - st0.host_update_s) * per},
          {"pinned_bytes", st1.pinned_bytes},
          {"host_bytes", engine.host_bytes()},
          {"predicted_gpu_bytes", built.plan.gpu_bytes},
          {"predicted_host_bytes", built.plan.host_bytes},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"uploads_per_step", double(st1.uploads - st0.uploads) * per},
          // what the uploads read from host memory a step (both passes), and the upload copies
          // (pinned working copies beside the fp32 masters that the uploads read instead)
          {"uploaded_bytes_per_step", double(st1.uploaded_bytes - st0.uploaded_bytes) * per},
          {"predicted_upload_bytes_per_pass", built.plan.upload_bytes},
          {"predicted_uploads_per_step", built.plan.uploads_per_step},
          {"upload_copies", built.plan.upload_copies.size()},
          {"upload_copy_bytes", built.plan.upload_copy_bytes},
          // the NVMe tier: bytes a step each way, seconds a step with a transfer in flight (the
          // disk's share of the steady step: disk_busy_ms / step_ms), the plan's disk time
          {"disk_read_bytes_per_step", double(st1.disk_read - st0.disk_read) * per},
          {"disk_written_bytes_per_step", double(st1.disk_written - st0.disk_written) * per},
          {"disk_busy_ms", 1e3 * (st1.disk_busy_s - st0.disk_busy_s) * per},
          {"predicted_disk_ms", 1e3 * built.plan.disk_s},
          {"disk_blobs", built.plan.disk_blobs.size()},
          {"predicted_disk_bytes", built.plan.disk_bytes},
          // which I/O path moved them (io_uring / threads, registered buffers, cuFile for checkpoints)
          {"disk_io", st1.disk_io},
          {"disk_cufile_bytes_per_step", double(st1.disk_gpu_direct - st0.disk_gpu_direct) * per},
          // pieces of AdamW state read ahead into checkpoints the backward freed, and the plan's bytes
          {"disk_lent_pieces_per_step", double(st1.disk_state_lent - st0.disk_state_lent) * per},
          {"predicted_lent_read_bytes", built.plan.lent_read_bytes},
          // model FLOPs on active parameters (MoE: router + top_k experts), MFU
          {"model_tflops_per_second", mfu_tflops},
          {"hardware_tflops_per_second", hw_tflops},
          {"mfu", hopper ? nlohmann::json(mfu_tflops / 989.0) : nlohmann::json(nullptr)},
          {"mfu_8n_of_gemm_peak", hopper ? nlohmann::json(mfu_8n) : nlohmann::json(nullptr)},
          {"executed_of_gemm_peak", hopper ? nlohmann::json(executed_of_peak) : nlohmann::json(nullptr)},
          {"active_parameters", active},
          {"first_loss", first_loss},  // the same batch every step: the loss falls as it trains
          {"loss", loss},
          {"op_profile", profile}};
}

}  // namespace sf

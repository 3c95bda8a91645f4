#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "backend/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "engine/make_engine.h"
#include "engine/rates.h"
#include "io/json_file.h"

namespace sf {

nlohmann::json preset_config(const std::string& name) {
  nlohmann::json llama = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", 128256},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 500000.0},
                          {"max_position_embeddings", 131072},
                          {"hidden_act", "silu"},
                          {"torch_dtype", "bfloat16"},
                          {"rope_scaling",
                           {{"rope_type", "llama3"},
                            {"factor", 32.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}}}};
  if (name == "llama-1b") {
    llama.update({{"hidden_size", 2048},
                  {"intermediate_size", 8192},
                  {"num_hidden_layers", 16},
                  {"num_attention_heads", 32},
                  {"num_key_value_heads", 8},
                  {"tie_word_embeddings", true}});
    return llama;
  }
  if (name == "llama-3b") {
    llama.update({{"hidden_size", 3072},
                  {"intermediate_size", 8192},
                  {"num_hidden_layers", 28},
                  {"num_attention_heads", 24},
                  {"num_key_value_heads", 8},
                  {"tie_word_embeddings", true}});
    return llama;
  }
  if (name == "llama-8b") {
    llama.update({{"hidden_size", 4096},
                  {"intermediate_size", 14336},
                  {"num_hidden_layers", 32},
                  {"num_attention_heads", 32},
                  {"num_key_value_heads", 8},
                  {"tie_word_embeddings", false}});
    return llama;
  }
  if (name == "qwen2.5-7b") {
    return {{"architectures", {"Qwen2ForCausalLM"}},
            {"model_type", "qwen2"},
            {"vocab_size", 152064},
            {"hidden_size", 3584},
            {"intermediate_size", 18944},
            {"num_hidden_layers", 28},
            {"num_attention_heads", 28},
            {"num_key_value_heads", 4},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"max_position_embeddings", 32768},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  }
  input_error("--preset", "unknown preset '" + name + "' (llama-1b, llama-3b, llama-8b, qwen2.5-7b)");
}

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
  BuiltEngine built = build_engine(spec, eo, er);
  const std::unique_ptr<Device>& dev = built.dev;
  Engine& engine = *built.engine;
  log_info("%s", plan_summary(built.plan).c_str());
  engine.init_random(1);
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
  double loss = 0;
  for (int64_t s = 0; s < o.warmup; ++s) loss = step(s);
  engine.synchronize();
  const Engine::Stats st0 = engine.stats();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < o.steps; ++s) loss = step(o.warmup + s);
  engine.synchronize();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Engine::Stats st1 = engine.stats();
  const double per = 1.0 / double(o.steps);
  double tps = double(o.batch_size) * b.T * o.grad_accum * double(o.steps) / secs;
  log_info("bench: %.1f ms/step, %.0f tokens/s, loss %.4f", 1e3 * secs / double(o.steps), tps, loss);
  return {{"tokens_per_second", tps},
          {"step_ms", 1e3 * secs / double(o.steps)},
          {"steps", o.steps},
          {"batch_size", o.batch_size},
          {"grad_accum", o.grad_accum},
          {"micro_batch", M},
          {"micro_batches", mbs.size()},
          {"seq_len", o.seq_len},
          {"parameters", spec.total_params()},
          {"device", dev->name()},
          {"engine", built.plan.engine},
          {"slots", built.plan.slots},
          {"gpu_blobs", built.plan.gpu_blobs.size()},
          {"predicted_tokens_per_second", built.plan.tokens_per_s},
          {"max_grad_norm", o.max_grad_norm},
          {"device_bytes", engine.device_bytes()},
          // host work a step (the sliding engine): AdamW; uploads of blobs; memory held
          {"host_update_ms", 1e3 * (st1.host_update_s - st0.host_update_s) * per},
          {"pinned_bytes", st1.pinned_bytes},
          {"host_bytes", engine.host_bytes()},
          {"predicted_gpu_bytes", built.plan.gpu_bytes},
          {"predicted_host_bytes", built.plan.host_bytes},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"uploads_per_step", double(st1.uploads - st0.uploads) * per},
          {"loss", loss}};
}

nlohmann::json run_plan(const PlanCliOptions& o) {
  const int sources = int(!o.model_dir.empty()) + int(!o.preset.empty()) + int(!o.config.empty());
  if (sources != 1) input_error("plan", "give one of --model DIR, --preset NAME or --config FILE");
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
  er.device = o.device;
  er.grad_accum = o.grad_accum;
  er.clip = o.max_grad_norm > 0;
  const PlanRequest r = plan_request(eo, er);
  const BackendInfo be = plan_backend(eo, er);
  MeasuredRates mr;
  if (o.measure) {
    mr = measure_rates(o.device);
    log_info("%s", mr.summary.c_str());
  }
  const Plan p = make_plan(spec, r, be, mr.rates);
  std::fputs(format_plan(spec, r, p).c_str(), stderr);
  nlohmann::json items = nlohmann::json::array();
  for (const MemoryItem& m : p.items)
    items.push_back({{"name", m.name},
                     {"bytes", m.bytes},
                     {"place", m.place == Place::Device   ? "gpu"
                               : m.place == Place::Pinned ? "pinned"
                                                          : "host"}});
  return {{"fits", p.fits},
          {"why", p.why},
          {"engine", p.engine},
          {"slots", p.slots},
          {"micro_batch", p.micro_batch},
          {"micro_batches", p.micro_batches},
          {"hold_grads", p.hold_grads},
          {"gpu_blobs", p.gpu_blobs},
          {"backend", be.name},
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
          {"rates",
           {{"measured", o.measure},
            {"model_tflops", mr.rates.model_tflops},
            {"host_adamw_params_s", mr.rates.host_adamw_params_s},
            {"host_read_gbs", mr.rates.host_read_gbs},
            {"pcie_gbs", mr.rates.pcie_gbs}}},
          {"items", items}};
}

}  // namespace sf

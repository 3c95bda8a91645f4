#include "train/plan_report.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "engine/make_engine.h"
#include "engine/rates.h"
#include "io/json_file.h"
#include "train/presets.h"

namespace sf {

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
  std::fputs(format_plan(spec, r, p, o.names).c_str(), stderr);
  nlohmann::json items = nlohmann::json::array();
  for (const MemoryItem& m : p.items)
    items.push_back({{"name", m.name},
                     {"bytes", m.bytes},
                     {"place", m.place == Place::Device   ? "gpu"
                               : m.place == Place::Pinned ? "pinned"
                               : m.place == Place::Host   ? "host"
                                                          : "disk"}});
  return {{"fits", p.fits},
          {"why", p.why(o.names)},
          {"engine", engine_name(p.engine)},
          {"slots", p.slots},
          {"micro_batch", p.micro_batch},
          {"micro_batches", p.micro_batches},
          {"hold_grads", p.hold_grads},
          {"gpu_blobs", p.gpu_blobs},
          {"disk_blobs", p.disk_blobs},
          {"ckpt_disk_layers", p.ckpt_disk_layers},
          {"disk_bytes", p.disk_bytes},
          {"disk_budget", p.disk_budget},
          {"predicted_disk_s", p.disk_s},
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
          {"rates",
           {{"measured", o.measure},
            {"model_tflops", mr.rates.model_tflops},
            {"host_adamw_params_s", mr.rates.host_adamw_params_s},
            {"host_read_gbs", mr.rates.host_read_gbs},
            {"pcie_gbs", mr.rates.pcie_gbs}}},
          {"items", items}};
}

}  // namespace sf

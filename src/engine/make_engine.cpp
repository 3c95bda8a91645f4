#include "engine/make_engine.h"

#include <algorithm>

#include "backend/op_profile.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "core/test_hooks.h"
#include "core/units.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "io/gds.h"

namespace sf {

std::unique_ptr<Engine> make_engine(Device& dev, const ModelSpec& spec, const EngineOptions& opt, const Plan& p,
                                    const EngineRequest& req) {
  if (p.engine == EngineKind::Resident) return std::make_unique<ResidentEngine>(dev, spec, opt);
  if (p.slots < 2) setting_error(Setting::Slots, "the sliding engine needs at least 2 GPU parameter slots");
  // The placement as planned (the checkpoints' I/O path included: chosen once, before the plan,
  // by build_engine, which counted that path's buffers).
  SlidingOptions so = sliding_options(p, opt, req.clip || !opt.optimizer);
  so.store.dir = req.offload_dir;
  if (const long long piece = test_hooks::disk_piece(); piece > 0 && !so.disk_blobs.empty()) {
    so.disk_piece = piece;
    log_info("test hook SF_TEST_DISK_PIECE: the offload dir's rings move pieces of %lld elements", piece);
  }
  return std::make_unique<SlidingEngine>(dev, spec, so);
}

BackendInfo plan_backend(const EngineOptions& opt, const EngineRequest& req) {
  BackendInfo be = backend_info(req.device, req.device_ordinal);
  if (opt.compute_dtype == "bf16" || opt.compute_dtype == "bfloat16") be.compute_dtype = DType::BF16;
  return be;
}

PlanRequest plan_request(const EngineOptions& opt, const EngineRequest& req) {
  PlanRequest r;
  r.batch = opt.max_batch;
  r.seq = opt.max_seq;
  r.grad_accum = std::max(opt.max_micro, req.grad_accum);
  r.training = opt.training;
  r.optimizer = opt.optimizer;
  r.clip = req.clip;
  r.offload = req.offload;
  r.slots = req.slots;
  r.gpu_blobs = req.gpu_blobs;
  r.whole_layers = req.whole_layers;
  r.kept_layers = req.kept_layers;
  r.gpu_budget = req.gpu_memory;
  r.host_budget = req.cpu_memory;
  r.offload_dir = req.offload_dir;
  r.disk_budget = req.disk_memory;
  r.hold_grads = env_int(Env::HoldGrads, 1);  // the knobs that change the plan (core/env.h)
  const long long early = env_int(Env::HoldEarly, -1);
  r.hold_early = early < 0 ? -1.0 : double(std::min<long long>(early, 100)) / 100.0;
  r.state_dtype = req.state_dtype;
  r.upload_copies = req.upload_copies;
  return r;
}

BuiltEngine build_engine(const ModelSpec& spec, const EngineOptions& opt, const EngineRequest& req) {
  BuiltEngine b;
  PhaseClock clock(b.setup);
  PlanRequest r = plan_request(opt, req);
  const BackendInfo be = plan_backend(opt, req);
  // How checkpoints on disk would move, chosen once, here (io/gds.h): the plan counts that path's
  // buffers (cuFile: no pinned ring) and the engine takes it from the plan.
  CheckpointIo io;
  if (!r.offload_dir.empty()) {
    io = choose_checkpoint_io(be.kind == DeviceKind::Cuda, r.offload_dir, env_text(Env::Cufile));
    if (io.cufile) r.ckpt_cufile = io.library;
  }
  b.plan = make_plan(spec, r, be);
  if (b.plan.ckpt_disk_layers > 0) log_info("checkpoint I/O: %s", io.text.c_str());
  const Plan& p = b.plan;
  if (!p.fits) {
    SettingText why = std::string("the ") + engine_name(p.engine) + " engine ";
    why += p.short_of.phrase();
    if (p.engine == EngineKind::Resident && req.offload == OffloadChoice::Off) why += {" (try ", Setting::Offload, ")"};
    why += "; `slideformer plan` lists every buffer";
    input_error_naming("plan", std::move(why));
  }
  clock.mark("plan");
  b.dev = make_device(req.device, req.gpu_memory, req.device_ordinal);
  if (req.profile_ops) b.dev = std::make_unique<ProfiledDevice>(std::move(b.dev));
  clock.mark("device");
  EngineOptions eo = opt;
  eo.max_batch = p.micro_batch;  // the micro-batches the plan counted (maybe split)
  eo.max_micro = p.micro_batches;
  eo.state_dtype = req.state_dtype;
  eo.whole_layers = p.whole_layers;
  eo.kept_layers = p.kept_layers;
  b.engine = make_engine(*b.dev, spec, eo, p, req);
  const PhaseTimes inner = b.engine->setup_times();  // its phases (logged as they ran)
  if (inner.phases.empty()) {
    clock.mark("engine");
  } else {
    const double engine_s = clock.lap();
    b.setup.append(inner);
    b.setup.phases.emplace_back("engine, the rest", std::max(0.0, engine_s - inner.total()));
  }
  return b;
}

}  // namespace sf

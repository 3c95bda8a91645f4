// Picks the engine: resident (everything in device memory) or sliding (offloaded).
#pragma once
#include <memory>
#include <vector>

#include "backend/device.h"
#include "engine/engine.h"
#include "engine/planner.h"

namespace sf {

// What the commands ask for; the planner decides the rest.
struct EngineRequest {
  std::string device = "auto";
  int device_ordinal = 0;  // which GPU (cudaSetDevice's number)
  OffloadChoice offload = OffloadChoice::Auto;
  int slots = 0;          // 0: the planner's choice
  int gpu_blobs = -1;     // sliding: blobs kept whole on the GPU (-1: as many as fit)
  // Layers kept whole and layers keeping attention's output (PlanRequest; -1: the planner's).
  int whole_layers = -1, kept_layers = -1;
  size_t gpu_memory = 0;  // the CUDA arena and the plan's GPU budget (0: 90% of the free memory)
  size_t cpu_memory = 0;  // the plan's host budget (0: MemAvailable)
  int grad_accum = 1;
  bool clip = true;
  // The NVMe tier: the offload directory (empty: none) and its budget (0: free space less 5 %).
  std::string offload_dir;
  size_t disk_memory = 0;
  DType state_dtype = DType::F32;  // AdamW m and v (EngineOptions::state_dtype, which build_engine sets)
  CopiesChoice upload_copies = CopiesChoice::Auto;  // PlanRequest::upload_copies (--upload-copies)
  // Diagnostics: the device is a ProfiledDevice (backend/op_profile.h) timing every op (`bench --profile-ops`).
  bool profile_ops = false;
};

struct Plan;
// The engine a plan chose (sliding: its slots, kept blobs, held gradients, blobs in the NVMe
// store), for the options the plan was made with; `req` gives clipping and the offload directory.
std::unique_ptr<Engine> make_engine(Device& dev, const ModelSpec& spec, const EngineOptions& opt, const Plan& p,
                                    const EngineRequest& req);

struct BuiltEngine {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Engine> engine;
  Plan plan;
  // Seconds of the set-up so far: the plan, the device, the engine's constructor (its own phases
  // when it times them, Engine::setup_times).
  PhaseTimes setup;
};

// Plans first; a plan that does not fit is refused with its numbers (InputError) before anything
// is allocated. Then the device and the planned engine (log plan_summary once the model loaded).
BuiltEngine build_engine(const ModelSpec& spec, const EngineOptions& opt, const EngineRequest& req);
// The planner's request for these options (what build_engine plans with).
PlanRequest plan_request(const EngineOptions& opt, const EngineRequest& req);
// The backend build_engine plans for (the compute dtype as the options ask).
BackendInfo plan_backend(const EngineOptions& opt, const EngineRequest& req);

}  // namespace sf

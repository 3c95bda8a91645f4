// session 19: the plan the bench makes for `--preset qwen3-30b-a3b --layers 4 --gpu-memory 24GiB --max-grad-norm 1` (8 x 2048,
// built-in rates; `plan` has no --layers). Built and run here, from the repository root:
//   g++ -O1 -std=c++20 -Isrc bench/results/2026-12-03s19_qwen3_4l_plan.cpp -o /tmp/q4 build/libsf.a build/libsf_cuda.a \
//     build/libsf_cuda_sm90.a build/libsf.a build/libsf_core.a -L/usr/local/cuda/lib64 -lcudart -luring -lopenblas \
//     -lpthread -lutf8proc -ldl && /tmp/q4
// Printed: predicted at best 24403 tokens/s.
#include <cstdio>
#include "backend/device.h"
#include "engine/planner.h"
#include "model/spec.h"
#include "train/presets.h"
using namespace sf;
int main() {
  auto cfg = preset_config("qwen3-30b-a3b");
  cfg["num_hidden_layers"] = 4;
  const ModelSpec s = parse_model_spec(cfg, "qwen3-30b-a3b");
  BackendInfo be = cuda_backend_sizes();
  be.device_total = be.device_free = size_t(140) << 30;
  PlanRequest r;
  r.batch = 8; r.seq = 2048; r.clip = true; r.gpu_budget = size_t(24) << 30; r.host_budget = size_t(110) << 30;
  const Plan p = make_plan(s, r, be, Rates{});
  std::printf("%s\npredicted %.0f tokens/s, step %.4f s\n", plan_summary(p).c_str(), 16384.0 / p.step_s, p.step_s);
}

// GPUDirect Storage on the GPU machine: the NVMe store's cuFile transfers between the offload file
// and GPU memory give the bytes back (compared with the store's own reads, odd sizes included),
// and a sliding engine whose checkpoints go disk <-> GPU through cuFile trains as the same engine
// with the io_uring + pinned bounce path. Skipped without a GPU or without libcufile
// (tools/gpu_check.sh gds runs it; on the GPU machine libcufile runs in compatibility mode).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../engine_state.h"
#include "../model_fixtures.h"
#include "../test_util.h"
#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/sliding_engine.h"
#include "io/gds.h"
#include "io/nvme_store.h"
#include "model/spec.h"

namespace sf {
namespace {

// The library the start-up choice would load for an offload dir in the temporary directory, or why
// none (libcufile absent, its driver or a file of that file system refused: the product then uses
// the pinned bounce and says so): the tests skip with that line.
std::string cufile_or_skip(std::string& why) {
  if (!cuda_available()) {
    why = "no GPU";
    return {};
  }
  test::TempDir probe;
  const CheckpointIo io = choose_checkpoint_io(true, probe.path.string(), "");
  why = io.text;
  return io.cufile ? io.library : std::string();
}

TEST(Gds, CuFileMovesTheBytesBetweenDiskAndGpu) {
  std::string why;
  const std::string lib = cufile_or_skip(why);
  if (lib.empty()) GTEST_SKIP() << why;
  auto dev = make_cuda_device(size_t(512) << 20);
  test::TempDir dir;
  StoreOptions o;
  o.dir = dir.path.string();
  o.bytes = size_t(96) << 20;
  o.cufile = lib;
  NvmeStore s(o);
  ASSERT_TRUE(s.gpu_direct());
  std::printf("store: %s; checkpoints: %s\n", s.how().c_str(), s.gpu_how().c_str());
  auto stream = dev->create_stream();
  std::mt19937_64 rng(17);
  // Odd sizes: a block and a bit, several MiB, 40 MiB + 3 bytes (cuFile's own pieces).
  for (const size_t n : {size_t(4096 + 1), size_t(7) << 20, (size_t(40) << 20) + 3}) {
    SCOPED_TRACE(n);
    std::vector<unsigned char> a(n), back(n), host_view(n);
    for (auto& x : a) x = static_cast<unsigned char>(rng());
    DeviceBuffer src(*dev, n), dst(*dev, n);
    dev->copy(src.data(), a.data(), n, CopyKind::HostToDevice, *stream);
    dev->synchronize(*stream);
    // Registered or not (a range inside the backend's arena; cuFile may refuse), the bytes must come.
    const bool registered = s.gpu_register(dst.data(), n);
    std::printf("%zu bytes, destination %s with cuFile\n", n, registered ? "registered" : "not registered");
    const uint64_t at = NvmeStore::kAlign * 5;
    s.gpu_write_wait(at, src.data(), n);
    s.read_sync(at, host_view.data(), n);  // what cuFile wrote, read by the store's own path
    EXPECT_EQ(std::memcmp(host_view.data(), a.data(), n), 0);
    s.gpu_read_wait(at, dst.data(), n);
    dev->copy(back.data(), dst.data(), n, CopyKind::DeviceToHost, *stream);
    dev->synchronize(*stream);
    EXPECT_EQ(std::memcmp(back.data(), a.data(), n), 0);
    if (registered) s.gpu_unregister(dst.data());
  }
  s.check();
  EXPECT_GT(s.gpu_bytes(), 0u);
}

struct TrainRun {
  std::vector<double> losses;
  test::NamedTensors params;
  Engine::Stats stats;
};

// Three steps of a tiny sliding engine with every layer's checkpoints in the store.
TrainRun train(const std::string& cufile) {
  const ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  auto dev = make_cuda_device(size_t(1) << 30);
  test::TempDir dir;
  SlidingOptions so;
  so.base.max_batch = 2;
  so.base.max_seq = 64;
  so.base.max_micro = 2;
  so.slots = 2;
  so.ckpt_disk_layers = spec.n_layer;
  so.store.dir = dir.path.string();
  so.store.cufile = cufile;
  SlidingEngine e(*dev, spec, so);
  e.init_random(7);
  std::mt19937_64 rng(5);
  std::vector<Record> recs(4);
  for (Record& r : recs) {
    for (int t = 0; t < 64; ++t) r.ids.push_back(int32_t(rng() % uint64_t(spec.vocab)));
    r.labels = r.ids;
  }
  TrainRun run;
  for (int step = 1; step <= 3; ++step) {
    Engine::StepParams p;
    p.adamw.lr = 1e-3f;
    p.adamw.step = step;
    p.max_grad_norm = 1.0;
    run.losses.push_back(e.step({make_batch({&recs[0], &recs[1]}, 64), make_batch({&recs[2], &recs[3]}, 64)}, p).loss);
  }
  e.synchronize();
  run.params = test::export_state(e, Engine::State::Params);
  run.stats = e.stats();
  return run;
}

TEST(Gds, SlidingEngineWithCheckpointsThroughCuFileTrainsAsTheBouncePath) {
  std::string why;
  const std::string lib = cufile_or_skip(why);
  if (lib.empty()) GTEST_SKIP() << why;
  const TrainRun direct = train(lib), bounce = train(""), again = train("");
  std::printf("cuFile run: %s, %llu bytes by cuFile; bounce run: %s\n", direct.stats.disk_io.c_str(),
              static_cast<unsigned long long>(direct.stats.disk_gpu_direct), bounce.stats.disk_io.c_str());
  EXPECT_NE(direct.stats.disk_io.find("cuFile"), std::string::npos) << direct.stats.disk_io;
  EXPECT_GT(direct.stats.disk_gpu_direct, 0u);
  EXPECT_EQ(bounce.stats.disk_gpu_direct, 0u);
  EXPECT_GT(bounce.stats.disk_read, 0u);
  // The first forward reads nothing back: its loss is the same bits. After it the checkpoints are
  // the same bits either way, and what differs is the order of the attention backward's atomics
  // (as between two runs of the bounce path: `again` shows that floor).
  ASSERT_EQ(direct.losses.size(), bounce.losses.size());
  EXPECT_EQ(direct.losses[0], bounce.losses[0]);
  double floor = 0, diff = 0;
  for (size_t i = 0; i < direct.params.size(); ++i) {
    floor = std::max(floor, test::rel_err(again.params[i].data, bounce.params[i].data));
    diff = std::max(diff, test::rel_err(direct.params[i].data, bounce.params[i].data));
  }
  for (size_t i = 1; i < direct.losses.size(); ++i)
    EXPECT_NEAR(direct.losses[i], bounce.losses[i], 1e-3 * std::fabs(bounce.losses[i])) << "step " << i + 1;
  std::printf("parameters after 3 steps: cuFile vs bounce rel err %.3g, bounce vs bounce %.3g\n", diff, floor);
  EXPECT_LE(diff, std::max(4 * floor, 1e-5));
}

}  // namespace
}  // namespace sf

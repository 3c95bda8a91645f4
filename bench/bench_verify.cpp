// The cost of verifying a model on load (issue 16): CRC-32C alone (the SSE4.2 instruction and the
// tables), and SafetensorsFile::verify_checksums (CRC + finite scan, tensors in parallel on
// cpu_pool) over a 1.5 GB bf16 file of 48 tensors of 32 MiB, page cache warm.
//   bench_verify [DIR]   (the file is written to DIR, default /tmp, and removed)
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

using namespace sf;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  const size_t n = size_t(1536) << 20;  // 1.5 GiB
  std::vector<uint8_t> buf(n);
  // Finite bf16 values (the high byte's exponent bits never all ones).
  for (size_t i = 0; i < n; ++i) buf[i] = uint8_t(uint32_t(i * 2654435761u) >> 13) & (i % 2 ? 0x3f : 0xff);
  double best_hw = 1e9, best_sw = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    double t = now();
    const uint32_t a = crc32c(buf.data(), n);
    best_hw = std::min(best_hw, now() - t);
    t = now();
    const uint32_t b = crc32c_portable(buf.data(), n);
    best_sw = std::min(best_sw, now() - t);
    if (a != b) return std::fprintf(stderr, "crc32c and crc32c_portable differ\n"), 1;
  }
  std::vector<TensorWrite> tw;
  const int64_t per = (int64_t(32) << 20) / 2;  // bf16 elements of 32 MiB
  for (int i = 0; i < 48; ++i)
    tw.push_back({"t" + std::to_string(i), DType::BF16, {per}, buf.data() + size_t(i) * size_t(per) * 2});
  const std::string path = dir + "/bench_verify.safetensors";
  write_safetensors(path, tw);
  double best_verify = 1e9, best_crc = 1e9;
  {
    auto f = SafetensorsFile::open(path);
    for (int rep = 0; rep < 3; ++rep) {
      double t = now();
      f.verify_checksums(true);
      best_verify = std::min(best_verify, now() - t);
      t = now();
      f.verify_checksums(false);
      best_crc = std::min(best_crc, now() - t);
    }
  }
  std::filesystem::remove(path);
  const double gb = double(n) / 1e9;
  std::printf(
      "{\"bytes\": %zu, \"threads\": %d, \"crc32c_1thread_GBps\": %.2f, \"crc32c_tables_1thread_GBps\": %.2f, "
      "\"verify_crc_finite_GBps\": %.2f, \"verify_crc_only_GBps\": %.2f}\n",
      n, cpu_pool().size(), gb / best_hw, gb / best_sw, gb / best_verify, gb / best_crc);
  return 0;
}

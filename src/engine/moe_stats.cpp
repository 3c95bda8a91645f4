#include "engine/moe_stats.h"

#include "core/align.h"

namespace sf {

MemoryItems moe_stats_buffers(const ModelSpec& s, int micro_batches) {
  if (!s.is_moe() || !s.moe.aux_loss) return {};
  const size_t block = round256(size_t(2) * size_t(s.moe.n_expert) * 4);
  return {{"router statistics (load-balancing loss)", block * size_t(std::max(micro_batches, 1)), Place::Device,
           "moe.stats"}};
}

void bind_moe_stats(BatchDims& d, const ModelSpec& s, const DeviceBuffer& buf, int j, int K, Ops& ops, Stream& st) {
  if (!buf.data()) return;
  const int64_t E = s.moe.n_expert;
  const size_t block = round256(size_t(2 * E) * 4);
  d.moe_stats = Tensor(static_cast<char*>(buf.data()) + size_t(j) * block, DType::F32, {2 * E});
  d.moe_aux_weight = float(s.moe.aux_coef / double(std::max(K, 1)));
  ops.zero(d.moe_stats, st);
}

}  // namespace sf

#include "engine/checkpoint_store.h"

#include <algorithm>
#include <string>

namespace sf {

CheckpointStore::CheckpointStore(Device& dev, int micro, int layers, size_t stride)
    : dev_(dev), layers_(std::max(layers, 1)), stride_(stride) {
  BufferSource src(dev, buffers(micro, layers, stride));
  host_ = src.buffer("ckpt.host");
  gpu_ = src.buffer("ckpt.fetch");
  for (int i = 0; i < 2; ++i) {
    ready_[i] = dev.create_event();
    free_[i] = dev.create_event();
  }
  offloaded_ = dev.create_event();
}

MemoryItems CheckpointStore::buffers(int micro, int layers, size_t stride) {
  return {{"checkpoints fetched for the backward", 2 * stride, Place::Device, "ckpt.fetch"},
          {"layer-input checkpoints (" + std::to_string(micro) + " micro-batches)",
           size_t(micro) * size_t(std::max(layers, 1)) * stride, Place::Pinned, "ckpt.host"}};
}

char* CheckpointStore::at(int j, int l) const {
  return static_cast<char*>(host_.data()) + (size_t(j) * size_t(layers_) + size_t(l)) * stride_;
}

void CheckpointStore::offload(int j, int l, const void* src, size_t bytes, Stream& d2h) {
  dev_.copy(at(j, l), src, bytes, CopyKind::DeviceToHost, d2h);
}

void CheckpointStore::forward_done(Stream& d2h) { dev_.record(*offloaded_, d2h); }

void CheckpointStore::fetch(int k, int j, int l, size_t bytes, Stream& h2d) {
  const int i = k % 2;
  dev_.wait(h2d, *free_[i]);
  dev_.wait(h2d, *offloaded_);
  dev_.copy(static_cast<char*>(gpu_.data()) + size_t(i) * stride_, at(j, l), bytes, CopyKind::HostToDevice, h2d);
  dev_.record(*ready_[i], h2d);
}

void* CheckpointStore::use(int k, Stream& compute) {
  dev_.wait(compute, *ready_[k % 2]);
  return static_cast<char*>(gpu_.data()) + size_t(k % 2) * stride_;
}

void CheckpointStore::done(int k, Stream& compute) { dev_.record(*free_[k % 2], compute); }

}  // namespace sf

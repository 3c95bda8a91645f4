#include "cli/option_names.h"

namespace sf {

const char* option_name(Setting s) {
  switch (s) {
    case Setting::Device:
      return "--device";
    case Setting::GpuMemory:
      return "--gpu-memory";
    case Setting::HostMemory:
      return "--cpu-memory";
    case Setting::BatchSize:
      return "--batch-size";
    case Setting::SeqLen:
      return "--seq-len";
    case Setting::GradAccum:
      return "--grad-accum";
    case Setting::Offload:
      return "--offload";
    case Setting::Slots:
      return "--slots";
    case Setting::GpuBlobs:
      return "--gpu-blobs";
    case Setting::ComputeDtype:
      return "--compute-dtype";
    case Setting::MaxRecordBytes:
      return "--max-record-bytes";
    case Setting::Resume:
      return "--resume";
    case Setting::Output:
      return "--output";
    case Setting::OffloadDir:
      return "--offload-dir";
    case Setting::DiskMemory:
      return "--disk-memory";
    case Setting::KeepAttention:
      return "--keep-attention";
    case Setting::KeepLayers:
      return "--keep-layers";
    case Setting::UploadCopies:
      return "--upload-copies";
    case Setting::OptimizerState:
      return "--optimizer-state";
  }
  return "";  // not reached: -Wswitch names a Setting without an option
}

}  // namespace sf

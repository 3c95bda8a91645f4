// The offload directory's disk, measured for the planner (`plan --measure --offload-dir DIR`):
// sequential O_DIRECT writes, then reads, of a scratch file in large blocks with several requests
// in flight (as the NVMe store moves whole blobs), each phase bounded in bytes and seconds.
#pragma once
#include <cstddef>
#include <string>

namespace sf {

struct DiskProbeOptions {
  size_t max_bytes = size_t(8) << 30;   // file size cap (also at most half the free space)
  size_t block_bytes = size_t(64) << 20;  // one request; a multiple of 4096
  int in_flight = 4;                      // requests in flight (one thread each)
  double seconds = 2.0;                   // each phase stops issuing after this long
};

struct DiskRate {
  double write_gbs = 0, read_gbs = 0;
  size_t bytes_written = 0, bytes_read = 0;
  double free_bytes = 0;  // the directory's free space before the probe
};

// The scratch file (DIR/.slideformer-disk-probe.PID.N, created exclusively) is removed afterwards,
// also on error. InputError naming DIR when it is not a writable directory, its file system does not
// take O_DIRECT (tmpfs), it has too little free space, or a write or read fails (ENOSPC, EIO).
DiskRate measure_disk(const std::string& dir, const DiskProbeOptions& o = {});

// The options `plan --measure` uses: the defaults, or SF_DISK_PROBE_MIB (the file size cap in MiB,
// with blocks of a quarter of it up to 64 MiB) for quick tests.
DiskProbeOptions disk_probe_options_from_env();

}  // namespace sf

// GPUDirect Storage through cuFile: the NVMe tier's checkpoints go straight between the offload
// file and GPU memory, without a pinned bounce buffer (docs/ENGINE.md "NVMe tier"). libcufile is
// loaded at run time (dlopen) and the few entry points used are declared here from the public API
// documentation: the build needs no cuFile headers, and a machine without the library runs the
// io_uring + pinned bounce path. Where the nvidia-fs kernel module is absent, cuFile runs in its
// "compatibility mode" (POSIX reads and writes through its own buffers): the same bytes.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sf {

// The library and its driver, open for the object's lifetime (one per NVMe store).
class CuFile {
 public:
  // nullptr, with `why` ("libcufile not found (...)", "cuFileDriverOpen failed: ..."), when the
  // library does not load or its driver does not open. `library`: a name for dlopen; empty: the
  // CUDA toolkit's libcufile.so.0, then libcufile.so, then /usr/local/cuda/lib64/libcufile.so.0.
  static std::unique_ptr<CuFile> open(const std::string& library, std::string& why);
  ~CuFile();
  CuFile(const CuFile&) = delete;
  CuFile& operator=(const CuFile&) = delete;

  const std::string& library() const;  // the name it was loaded by
  // "compatibility mode" (the nvidia-fs module not loaded) or "GPUDirect (nvidia-fs)".
  std::string mode() const;
  // cuFile calls with GPU buffers need a current CUDA context on the calling thread: open()
  // notes the caller's (through libcuda, when the process has loaded it), and a thread that
  // transfers calls bind_thread() first. (Stream host functions may make no CUDA call, so the
  // transfers run on a thread of the store's own: nvme_store.cpp.)
  void bind_thread() const;

  // A file descriptor registered with cuFile (nullptr and `why` when refused).
  void* register_file(int fd, std::string& why);
  void deregister_file(void* handle);
  // GPU memory registered for transfers (faster; unregistered memory works too). False when refused.
  bool register_buffer(const void* dev, size_t bytes);
  void deregister_buffer(const void* dev);
  // Blocking transfers of device memory: bytes moved (maybe fewer), or -errno (a cuFile error: -EIO,
  // its code in `detail`).
  ssize_t read(void* handle, void* dev, size_t bytes, uint64_t offset, std::string& detail);
  ssize_t write(void* handle, const void* dev, size_t bytes, uint64_t offset, std::string& detail);

  struct Api;  // the entry points (io/gds.cpp)

 private:
  CuFile() = default;
  std::unique_ptr<Api> api_;
  std::string library_;
};

// How the checkpoints on disk move, chosen once at start-up: cuFile when the backend has GPU
// memory, SF_CUFILE allows it, libcufile loads, its driver opens and it takes a file of the
// offload directory; else the store's reads and writes through the pinned ring.
struct CheckpointIo {
  bool cufile = false;
  std::string library;  // what to load (StoreOptions::cufile) when cufile
  // "cuFile (libcufile.so.0 loaded, compatibility mode)" | "io_uring + pinned bounce: libcufile
  // not found (...)": what `plan` and the log say.
  std::string text;
};
// setting: SF_CUFILE's text: "" or "auto", "0" (never), or a library path to load (tests: the cpu
// backend then too). offload_dir: where the probe file is registered (empty: no probe).
CheckpointIo choose_checkpoint_io(bool gpu_backend, const std::string& offload_dir, const std::string& setting);

}  // namespace sf

// A stand-in for libcufile, for the cpu backend's tests only: the cuFile calls the NVMe store makes
// (io/gds.cpp), done with pread/pwrite on the registered descriptor, "device" memory being host
// memory as on the cpu backend (the file reopened without O_DIRECT, so any buffer and size goes, as
// cuFile's compatibility mode takes them). It lets CPU tests run the GPUDirect Storage path of the store and
// of the checkpoint store (ordering, counters, faults) where no GPU and no libcufile exist; the GPU
// test (tests/gpu/test_gds.cpp) runs the real library. Written from the public API's signatures;
// FAKE_CUFILE_REFUSE_HANDLE=1 makes cuFileHandleRegister fail as on a filesystem cuFile rejects.
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>

#include <cerrno>
#include <cstddef>
#include <cstdlib>

namespace {
struct Status {  // CUfileError_t
  int err;
  int cu_err;
};
struct Descr {  // CUfileDescr_t
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
struct Handle {
  int fd;
};
constexpr int kInvalidFileType = 5018;  // CU_FILE_INVALID_FILE_TYPE
constexpr int kInvalidValue = 5022;     // CU_FILE_INVALID_VALUE
bool driver_open = false;
}  // namespace

extern "C" {

__attribute__((visibility("default"))) Status cuFileDriverOpen() {
  driver_open = true;
  return {0, 0};
}

__attribute__((visibility("default"))) Status cuFileDriverClose() {
  driver_open = false;
  return {0, 0};
}

__attribute__((visibility("default"))) Status cuFileHandleRegister(void** fh, Descr* d) {
  const char* refuse = std::getenv("FAKE_CUFILE_REFUSE_HANDLE");
  if (refuse && *refuse == '1') return {kInvalidFileType, 0};
  if (!driver_open || !fh || !d || d->type != 1 || d->handle.fd < 0) return {kInvalidValue, 0};
  const int fd = ::open(("/proc/self/fd/" + std::to_string(d->handle.fd)).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return {kInvalidFileType, 0};
  *fh = new Handle{fd};
  return {0, 0};
}

__attribute__((visibility("default"))) void cuFileHandleDeregister(void* fh) {
  if (!fh) return;
  ::close(static_cast<Handle*>(fh)->fd);
  delete static_cast<Handle*>(fh);
}

__attribute__((visibility("default"))) Status cuFileBufRegister(const void* p, size_t n, int) {
  return p && n ? Status{0, 0} : Status{kInvalidValue, 0};
}

__attribute__((visibility("default"))) Status cuFileBufDeregister(const void*) { return {0, 0}; }

__attribute__((visibility("default"))) ssize_t cuFileRead(void* fh, void* p, size_t n, off_t off, off_t p_off) {
  if (!fh) return -kInvalidValue;
  return ::pread(static_cast<Handle*>(fh)->fd, static_cast<char*>(p) + p_off, n, off);
}

__attribute__((visibility("default"))) ssize_t cuFileWrite(void* fh, const void* p, size_t n, off_t off,
                                                           off_t p_off) {
  if (!fh) return -kInvalidValue;
  return ::pwrite(static_cast<Handle*>(fh)->fd, static_cast<const char*>(p) + p_off, n, off);
}
}

#include "io/gds.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sf {

// In a named namespace, not the anonymous one: CuFile::Api, a class with linkage, holds them (a
// unity build would warn that its members have internal linkage).
namespace cufile_abi {
// The cuFile ABI, from the public API documentation: every call returns CUfileError_t, a pair of
// enums {CUfileOpError, CUresult} (0 = CU_FILE_SUCCESS); a file is described by CUfileDescr_t
// {type, union {int fd; void* handle}, const CUfileFSOps_t* fs_ops}; CUfileHandle_t is a pointer.
struct CuFileStatus {
  int err;     // CUfileOpError
  int cu_err;  // CUresult, when err is a CUDA driver error
};
struct CuFileDescr {
  int type;  // CUfileFileHandleType
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
}  // namespace cufile_abi
using cufile_abi::CuFileDescr;
using cufile_abi::CuFileStatus;

namespace {

constexpr int kOpaqueFd = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD

std::string status_text(const char* call, CuFileStatus s) {
  std::string t = std::string(call) + " failed: cuFile error " + std::to_string(s.err);
  if (s.cu_err != 0) t += " (CUDA driver error " + std::to_string(s.cu_err) + ")";
  return t;
}

}  // namespace

struct CuFile::Api {
  void* lib = nullptr;
  bool driver_open = false;
  void* libcuda = nullptr;  // the CUDA driver, when the process has loaded it
  void* context = nullptr;  // CUcontext current where open() was called
  int (*set_context)(void* ctx) = nullptr;  // cuCtxSetCurrent
  CuFileStatus (*driver_open_fn)() = nullptr;
  CuFileStatus (*driver_close_fn)() = nullptr;
  CuFileStatus (*handle_register)(void** fh, CuFileDescr* descr) = nullptr;
  void (*handle_deregister)(void* fh) = nullptr;
  CuFileStatus (*buf_register)(const void* dev, size_t bytes, int flags) = nullptr;
  CuFileStatus (*buf_deregister)(const void* dev) = nullptr;
  ssize_t (*read)(void* fh, void* dev, size_t bytes, off_t file_offset, off_t dev_offset) = nullptr;
  ssize_t (*write)(void* fh, const void* dev, size_t bytes, off_t file_offset, off_t dev_offset) = nullptr;

  ~Api() {
    if (driver_open && driver_close_fn) driver_close_fn();
    if (lib) ::dlclose(lib);
    if (libcuda) ::dlclose(libcuda);
  }
};

namespace {
// The symbol `name`, else its versioned twin `alt` (newer toolkits export some calls as *_v2).
template <class F>
bool bind(void* lib, F& f, const char* name, const char* alt = nullptr) {
  void* p = ::dlsym(lib, name);
  if (!p && alt) p = ::dlsym(lib, alt);
  f = reinterpret_cast<F>(p);
  return p != nullptr;
}
}  // namespace

std::unique_ptr<CuFile> CuFile::open(const std::string& library, std::string& why) {
  auto api = std::make_unique<Api>();
  std::string name = library;
  std::string errors;
  // The loader's path first, then the CUDA toolkit's default place (not always in ld.so.conf).
  for (const char* cand : {"libcufile.so.0", "libcufile.so", "/usr/local/cuda/lib64/libcufile.so.0"}) {
    const std::string n = library.empty() ? cand : library;
    api->lib = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->lib) {
      name = n;
      break;
    }
    const char* e = ::dlerror();
    if (errors.empty() && e) errors = e;
    if (!library.empty()) break;
  }
  if (!api->lib) {
    why = "libcufile not found" + (errors.empty() ? std::string() : " (" + errors + ")");
    return nullptr;
  }
  std::string missing;
  auto need = [&](bool ok, const char* what) {
    if (!ok && missing.empty()) missing = what;
  };
  need(bind(api->lib, api->driver_open_fn, "cuFileDriverOpen"), "cuFileDriverOpen");
  need(bind(api->lib, api->driver_close_fn, "cuFileDriverClose_v2", "cuFileDriverClose"), "cuFileDriverClose");
  need(bind(api->lib, api->handle_register, "cuFileHandleRegister"), "cuFileHandleRegister");
  need(bind(api->lib, api->handle_deregister, "cuFileHandleDeregister"), "cuFileHandleDeregister");
  need(bind(api->lib, api->buf_register, "cuFileBufRegister"), "cuFileBufRegister");
  need(bind(api->lib, api->buf_deregister, "cuFileBufDeregister"), "cuFileBufDeregister");
  need(bind(api->lib, api->read, "cuFileRead"), "cuFileRead");
  need(bind(api->lib, api->write, "cuFileWrite"), "cuFileWrite");
  if (!missing.empty()) {
    why = name + " lacks " + missing;
    return nullptr;
  }
  const CuFileStatus s = api->driver_open_fn();
  if (s.err != 0) {
    why = name + ": " + status_text("cuFileDriverOpen", s);
    return nullptr;
  }
  api->driver_open = true;
  // The caller's CUDA context (RTLD_NOLOAD: only a process that runs CUDA has the driver loaded).
  api->libcuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  int (*get_context)(void**) = nullptr;
  if (api->libcuda && bind(api->libcuda, get_context, "cuCtxGetCurrent") &&
      bind(api->libcuda, api->set_context, "cuCtxSetCurrent") && get_context(&api->context) != 0)
    api->context = nullptr;
  std::unique_ptr<CuFile> f(new CuFile());
  f->api_ = std::move(api);
  f->library_ = name;
  return f;
}

CuFile::~CuFile() = default;

const std::string& CuFile::library() const { return library_; }

std::string CuFile::mode() const {
  // The nvidia-fs module (true GPUDirect) shows itself in /proc; without it cuFile falls back to
  // POSIX transfers through its own buffers.
  struct stat st{};
  return ::stat("/proc/driver/nvidia-fs", &st) == 0 ? "GPUDirect (nvidia-fs)" : "compatibility mode";
}

void CuFile::bind_thread() const {
  if (api_->context && api_->set_context) api_->set_context(api_->context);
}

void* CuFile::register_file(int fd, std::string& why) {
  CuFileDescr d{};
  d.type = kOpaqueFd;
  d.handle.fd = fd;
  void* h = nullptr;
  const CuFileStatus s = api_->handle_register(&h, &d);
  if (s.err != 0) {
    why = status_text("cuFileHandleRegister", s);
    return nullptr;
  }
  return h;
}

void CuFile::deregister_file(void* handle) {
  if (handle) api_->handle_deregister(handle);
}

bool CuFile::register_buffer(const void* dev, size_t bytes) { return api_->buf_register(dev, bytes, 0).err == 0; }

void CuFile::deregister_buffer(const void* dev) { api_->buf_deregister(dev); }

namespace {
// cuFileRead/Write: -1 with errno for a system error, another negative value for a cuFile error.
ssize_t io_result(ssize_t r, std::string& detail) {
  if (r >= 0) return r;
  if (r == -1) return errno ? -ssize_t(errno) : -ssize_t(EIO);
  detail = "cuFile error " + std::to_string(-r);
  return -ssize_t(EIO);
}
}  // namespace

ssize_t CuFile::read(void* handle, void* dev, size_t bytes, uint64_t offset, std::string& detail) {
  errno = 0;
  return io_result(api_->read(handle, dev, bytes, off_t(offset), 0), detail);
}

ssize_t CuFile::write(void* handle, const void* dev, size_t bytes, uint64_t offset, std::string& detail) {
  errno = 0;
  return io_result(api_->write(handle, dev, bytes, off_t(offset), 0), detail);
}

CheckpointIo choose_checkpoint_io(bool gpu_backend, const std::string& offload_dir, const std::string& setting) {
#ifdef SF_HAVE_LIBURING
  const std::string bounce = "io_uring + pinned bounce: ";
#else
  const std::string bounce = "worker threads + pinned bounce: ";
#endif
  CheckpointIo c;
  if (setting == "0" || setting == "off") {
    c.text = bounce + "SF_CUFILE=0";
    return c;
  }
  const bool automatic = setting.empty() || setting == "auto";
  if (automatic && !gpu_backend) {
    c.text = bounce + "the cpu backend has no GPU memory";
    return c;
  }
  std::string why;
  const std::unique_ptr<CuFile> f = CuFile::open(automatic ? std::string() : setting, why);
  if (!f) {
    c.text = bounce + why;
    return c;
  }
  if (!offload_dir.empty()) {
    // The probe: cuFile must take a file of the offload directory, opened as the store opens its
    // own (O_DIRECT where allowed); the file has no name and disappears with its descriptor.
    int fd = ::open(offload_dir.c_str(), O_RDWR | O_CLOEXEC | O_TMPFILE | O_DIRECT, 0600);
    if (fd < 0) fd = ::open(offload_dir.c_str(), O_RDWR | O_CLOEXEC | O_TMPFILE, 0600);
    if (fd >= 0) {
      void* h = f->register_file(fd, why);
      f->deregister_file(h);
      ::close(fd);
      if (!h) {
        c.text = bounce + f->library() + " loaded, but " + why + " on a file of " + offload_dir;
        return c;
      }
    }  // no O_TMPFILE here: the store's own registration decides (an error there is loud)
  }
  c.cufile = true;
  c.library = f->library();
  c.text = "cuFile (" + f->library() + " loaded, " + f->mode() + ")";
  return c;
}

}  // namespace sf

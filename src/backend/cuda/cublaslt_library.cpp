#include "backend/cuda/cublaslt_library.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <stdexcept>
#include <string>

#ifndef SF_CUBLASLT_SONAME
#error "SF_CUBLASLT_SONAME (the toolkit's libcublasLt.so.N) comes from CMakeLists.txt"
#endif

namespace sf::cuda {
namespace {

// The soname through the usual search (RUNPATH, LD_LIBRARY_PATH, ld.so.cache), then beside the
// libcudart this process loaded (the same toolkit's lib directory, wherever it was installed).
void* open_library(std::string& tried) {
  tried = SF_CUBLASLT_SONAME;
  if (void* h = dlopen(SF_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string(" (") + dlerror() + ")";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaRuntimeGetVersion), &info) != 0 && info.dli_fname) {
    std::string dir = info.dli_fname;
    const size_t slash = dir.rfind('/');
    if (slash != std::string::npos) {
      const std::string path = dir.substr(0, slash + 1) + SF_CUBLASLT_SONAME;
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      tried += ", " + path + " (" + dlerror() + ")";
    }
  }
  return nullptr;
}

CublasLt load() {
  std::string tried;
  void* h = open_library(tried);
  if (!h) throw std::runtime_error("the CUDA backend needs cuBLASLt: cannot load " + tried);
  CublasLt t;
#define SF_CUBLASLT_LOAD(f)                            \
  t.f = reinterpret_cast<decltype(t.f)>(dlsym(h, #f)); \
  if (!t.f) throw std::runtime_error(std::string(SF_CUBLASLT_SONAME) + " has no function " #f);
  SF_CUBLASLT_FUNCTIONS(SF_CUBLASLT_LOAD)
#undef SF_CUBLASLT_LOAD
  return t;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt table = load();  // a failed load throws and is retried by the next call
  return table;
}

}  // namespace sf::cuda

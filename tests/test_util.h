// Shared test helpers: seeded random data, owned host tensors (F32/BF16/I32), error measures
// and central finite differences. Generic: no knowledge of any particular op.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sf::test {

// ---- sizes of the heaviest tests ----

// The sanitizer builds (SF_SANITIZER_BUILD, set by -DSF_SANITIZE) run mostly at -O0 with every
// allocation and access checked, 5-25x slower. The few tests that are heavy for their sizes take the
// full size in the ordinary build (what `make test` proves) and a smaller one there, where the code
// paths, not the sizes, are what the sanitizers check. Each use says what it keeps.
#ifdef SF_SANITIZER_BUILD
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
template <class T>
constexpr T heavy(T normal, T sanitized) {
  return kSanitizerBuild ? sanitized : normal;
}

// ---- files ----

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---- the slideformer binary (SF_BINARY), run in a scratch directory per test ----

struct CmdResult {
  int code = -1;
  std::string out, err;
  nlohmann::json last() const {  // the last stdout line, parsed
    std::string line, prev;
    std::istringstream in(out);
    while (std::getline(in, line))
      if (!line.empty()) prev = line;
    return nlohmann::json::parse(prev);
  }
};

class BinaryTest : public ::testing::Test {
 protected:
  explicit BinaryTest(std::string prefix = "sf_cli_") : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / (prefix_ + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  CmdResult run(const std::string& args) {
    CmdResult r;
    const std::filesystem::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = std::string(SF_BINARY) + " " + args + " >" + out.string() + " 2>" + err.string();
    const int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

// A fresh directory under the system temp directory, named after the running test; removed at
// scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("sf_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Runs fn, expects an InputError whose message contains every one of `parts`; returns the message.
inline std::string expect_input_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const InputError& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

// Runs fn, expects an InputError about `setting` (InputError::setting, data, not text); returns it.
inline InputError expect_setting_error(const std::function<void()>& fn, Setting setting) {
  try {
    fn();
  } catch (const InputError& e) {
    EXPECT_TRUE(e.setting == setting) << "expected the setting " << setting_name(setting) << ": " << e.what();
    return e;
  }
  ADD_FAILURE() << "no InputError thrown";
  return InputError("no InputError thrown");
}

// ---- random data (deterministic per seed) ----

inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.f, float mean = 0.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> randu(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Integers in [lo, hi).
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- bf16 ----

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
// Relative spacing of bf16 (8 significant bits): one rounding moves a value by <= half of it.
constexpr double kBf16Eps = 1.0 / 128;

// ---- owned host tensors ----

// A tensor that owns its (8-byte aligned) storage; t() is the view the kernels take.
struct HostTensor {
  std::vector<uint64_t> storage;
  Tensor view;

  HostTensor() = default;
  HostTensor(DType dt, std::initializer_list<int64_t> dims) {
    view = Tensor(nullptr, dt, dims);
    storage.assign((view.bytes() + 7) / 8 + 1, 0);
    view.data = storage.data();
  }
  // Values converted to dt (BF16: nearest-even; I32: truncation of exact integers).
  HostTensor(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> dims) : HostTensor(dt, dims) {
    EXPECT_EQ(int64_t(v.size()), view.numel());
    for (int64_t i = 0; i < std::min<int64_t>(int64_t(v.size()), view.numel()); ++i) set(i, v[size_t(i)]);
  }
  static HostTensor i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
    HostTensor h(DType::I32, dims);
    EXPECT_EQ(int64_t(v.size()), h.view.numel());
    std::memcpy(h.view.data, v.data(), std::min<size_t>(v.size() * 4, h.view.bytes()));
    return h;
  }
  HostTensor(HostTensor&& o) noexcept : storage(std::move(o.storage)), view(o.view) { view.data = storage.data(); }
  HostTensor& operator=(HostTensor&& o) noexcept {
    storage = std::move(o.storage);
    view = o.view;
    view.data = storage.data();
    return *this;
  }

  Tensor t() const { return view; }
  int64_t numel() const { return view.numel(); }
  float get(int64_t i) const {
    switch (view.dtype) {
      case DType::F32:
        return view.ptr<float>()[i];
      case DType::BF16:
        return bf16_to_float(view.ptr<bf16>()[i]);
      case DType::F16:
        return f16_to_float(view.ptr<uint16_t>()[i]);
      case DType::I32:
        return float(view.ptr<int32_t>()[i]);
    }
    return 0.f;
  }
  void set(int64_t i, float x) {
    switch (view.dtype) {
      case DType::F32:
        view.ptr<float>()[i] = x;
        break;
      case DType::BF16:
        view.ptr<bf16>()[i] = float_to_bf16(x);
        break;
      case DType::F16:
        view.ptr<uint16_t>()[i] = float_to_f16(x);
        break;
      case DType::I32:
        view.ptr<int32_t>()[i] = int32_t(x);
        break;
    }
  }
  void fill(float x) {
    for (int64_t i = 0; i < numel(); ++i) set(i, x);
  }
  std::vector<float> f() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = get(i);
    return v;
  }
};

// A view of a std::vector's memory (the vector must outlive it).
// SF_ADAMW_ISA for the scope (cpu::adamw reads it at each call): the kernel's paths, each in turn.
struct AdamwIsaScope {
  explicit AdamwIsaScope(const char* isa) {
    if (isa) ::setenv("SF_ADAMW_ISA", isa, 1);
  }
  ~AdamwIsaScope() { ::unsetenv("SF_ADAMW_ISA"); }
};
inline constexpr const char* kAdamwIsas[] = {nullptr, "sse2", "scalar"};  // nullptr: the widest this CPU has

inline Tensor view_of(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::F32, dims);
}
inline Tensor view_of(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::I32, dims);
}

inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Runs fn and expects a check failure (SF_CHECK: "file:line: message") naming `file` and `what`.
template <class F>
void expect_check_failure(F&& fn, const std::string& file, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "expected a failure mentioning " << what;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// ---- error measures (b is the reference) ----

template <class A, class B>
double dot(const std::vector<A>& a, const std::vector<B>& b) {
  double s = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

// Norm-wise relative error ||a - b|| / ||b||; 0 when both are 0; inf on NaN or size mismatch.
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (std::isnan(num)) return INFINITY;
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

// Worst element-wise |a - b| / (|b| + floor): catches a single bad element that a norm hides.
template <class A, class B>
double max_rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double e = std::fabs(double(a[i]) - double(b[i])) / (std::fabs(double(b[i])) + floor);
    if (std::isnan(e)) return INFINITY;
    m = std::max(m, e);
  }
  return m;
}

#define SF_EXPECT_REL_ERR(a, b, tol)                                                                 \
  do {                                                                                               \
    const double sf_e_ = ::sf::test::rel_err((a), (b));                                              \
    EXPECT_LE(sf_e_, (tol)) << "rel_err(" #a ", " #b ") = " << sf_e_ << " over tolerance " << (tol); \
  } while (0)

// ---- finite differences ----

// All of [0, n) when n <= max_n, else max_n distinct indices drawn with `seed` (sorted).
inline std::vector<size_t> sample_indices(size_t n, size_t max_n, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t(0));
  if (n <= max_n) return idx;
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(max_n);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Central differences (f(x + eps e_i) - f(x - eps e_i)) / 2 eps of a scalar f() that reads x,
// at the given indices of x (x is restored). Error: O(eps^2 f''') + O(ulp(f) / eps).
template <class T, class F>
std::vector<double> numeric_grad(std::vector<T>& x, const std::vector<size_t>& idx, double eps, F&& f) {
  std::vector<double> g;
  g.reserve(idx.size());
  for (size_t i : idx) {
    const T x0 = x[i];
    x[i] = T(double(x0) + eps);
    const double fp = f();
    x[i] = T(double(x0) - eps);
    const double fm = f();
    x[i] = x0;
    g.push_back((fp - fm) / (2.0 * eps));
  }
  return g;
}

// The analytic gradient at the same indices, for comparing with numeric_grad.
template <class T>
std::vector<double> gather(const std::vector<T>& g, const std::vector<size_t>& idx) {
  std::vector<double> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(double(g[i]));
  return out;
}

// ---- hostile values by class ----

// Calls fn(variant, what) for every member and element of `base` at every depth (each leaf of its
// flattening for which keep(leaf pointer) holds, with all of its parents) set to each of `values`
// and, where its parent is an object, removed; `what` names the change. In the flattening's order,
// each member once.
inline void for_each_hostile_variant(const nlohmann::json& base, const std::vector<nlohmann::json>& values,
                                     const std::function<void(const nlohmann::json&, const std::string&)>& fn,
                                     const std::function<bool(const std::string&)>& keep = {}) {
  using Pointer = nlohmann::json::json_pointer;
  std::vector<Pointer> paths;
  std::set<std::string> seen;
  const nlohmann::json flat = base.flatten();
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    if (keep && !keep(it.key())) continue;
    for (Pointer p(it.key()); !p.empty(); p = p.parent_pointer())
      if (seen.insert(p.to_string()).second) paths.push_back(p);
  }
  for (const Pointer& p : paths) {
    for (const nlohmann::json& v : values) {
      nlohmann::json j = base;
      j[p] = v;
      fn(j, p.to_string() + " = " + v.dump().substr(0, 40));
    }
    if (base[p.parent_pointer()].is_object()) {
      nlohmann::json j = base;
      j[p.parent_pointer()].erase(p.back());
      fn(j, p.to_string() + " removed");
    }
  }
}

}  // namespace sf::test

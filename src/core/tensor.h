// A tensor view: pointer, element type, shape. Owns nothing.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace sf {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    for (int64_t x : dims) shape[ndim++] = x;
  }

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    if (ndim == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  // Last dimension, and the product of all others: ops see every tensor as a matrix.
  int64_t cols() const { return ndim ? shape[ndim - 1] : 0; }
  int64_t rows() const { return ndim ? numel() / cols() : 0; }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Same memory, other shape (numel must match; checked by the caller).
  Tensor view(std::initializer_list<int64_t> dims) const { return Tensor(data, dtype, dims); }
  std::string shape_str() const;
};

}  // namespace sf

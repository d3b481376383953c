// A device allocation for the CUDA tests: n elements of T (at least one), freed with the object.
#pragma once

#include <algorithm>
#include <cstddef>

#include <cuda_runtime.h>

#include "backend/cuda/check.h"

namespace dsuf::cuda_test {

template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t n_) : n(n_) { DSUF_CUDA(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

}  // namespace dsuf::cuda_test

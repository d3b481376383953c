// CUDA error checks: a failed runtime call becomes a dsuf::Error naming the call and the location.
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define DSUF_CUDA(expr)                                                                           \
  do {                                                                                            \
    cudaError_t err_ = (expr);                                                                    \
    if (err_ != cudaSuccess)                                                                      \
      ::dsuf::fail("CUDA error at ", __FILE__, ":", __LINE__, ": ", #expr, ": ", cudaGetErrorString(err_)); \
  } while (0)

// The tiny model's CUDA backend (GPU 0) and CPU reference, shared by the conversation-cache GPU
// tests.
#pragma once

#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "backend/factory.h"
#include "tiny_fixture.h"

namespace dsuf::testing {

inline Backend& tiny_cuda_backend() {
  static std::unique_ptr<Backend> b = make_backend(tiny_model(), compressed_ids(),
                                                   BackendOptions{.cpu = false,
                                                                  .gpus = {0},
                                                                  .max_batch = 2,
                                                                  .max_context = 512,
                                                                  .numerics = {},
                                                                  .cpu_threads = 0});
  return *b;
}

inline Backend& tiny_cpu_backend() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 0);
  return b;
}

}  // namespace dsuf::testing

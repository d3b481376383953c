// Picks the backend the flags ask for: the CPU reference (`--cpu`) or the CUDA backend (`--gpus`),
// the latter only where the build has it. Tools and the server call this; nothing else names a
// concrete backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/weights.h"

namespace dsuf {

struct BackendOptions {
  bool cpu = true;
  std::vector<int> gpus;       // CUDA devices; more than one: tensor parallel over them
  int max_batch = 8;           // sequences held at once (for the GPU memory plan)
  int64_t max_context = 4096;  // tokens per sequence (for the GPU memory plan)
  CpuNumerics numerics;
  int cpu_threads = 0;
};

// "0,1,2" -> {0, 1, 2}; throws naming the bad entry.
std::vector<int> parse_gpu_list(const std::string& s);

bool cuda_backend_built();

std::unique_ptr<Backend> make_backend(const LoadedModel& model, std::vector<int32_t> compressed_ids,
                                      const BackendOptions& opt);

}  // namespace dsuf

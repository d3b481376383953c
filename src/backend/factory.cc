#include "backend/factory.h"

#include "core/error.h"
#ifdef DSUF_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsuf {

std::vector<int> parse_gpu_list(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || v < 0 || v > 1024) fail("--gpus: '", tok, "' is not a GPU index (expected e.g. 0,1,2,3)");
    out.push_back(static_cast<int>(v));
    i = j + 1;
  }
  return out;
}

bool cuda_backend_built() {
#ifdef DSUF_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const LoadedModel& model, std::vector<int32_t> compressed_ids,
                                      const BackendOptions& opt) {
  if (opt.cpu || opt.gpus.empty())
    return std::make_unique<CpuBackend>(model, std::move(compressed_ids), opt.numerics, opt.cpu_threads);
#ifdef DSUF_HAVE_CUDA
  if (opt.gpus.size() > 1)
    fail("--gpus ", opt.gpus.size(), " devices: tensor parallelism is not implemented yet; give one GPU");
  CudaOptions co{.device = opt.gpus[0], .max_context = opt.max_context, .max_chunk = 512, .numerics = opt.numerics,
                 .max_batch = opt.max_batch};
  return std::make_unique<CudaBackend>(model, std::move(compressed_ids), co);
#else
  fail("--gpus: this build has no CUDA backend (nvcc was not found when it was configured); use --cpu");
#endif
}

}  // namespace dsuf

#include "backend/factory.h"

#include "core/error.h"
#include "core/parse.h"
#ifdef DSUF_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsuf {

std::vector<int> parse_gpu_list(const std::string& s) {
  std::vector<int> out;
  for (int64_t v : parse_int_list(s, "--gpus (expected e.g. 0,1,2,3)", 0, 1024)) out.push_back(int(v));
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
  // More than one GPU: tensor parallel over them (docs/tp.md); one GPU runs the same code at world size 1.
  CudaOptions co{.device = opt.gpus[0], .max_context = opt.max_context, .max_chunk = 512, .numerics = opt.numerics,
                 .max_batch = opt.max_batch, .devices = opt.gpus};
  return std::make_unique<CudaBackend>(model, std::move(compressed_ids), co);
#else
  fail("--gpus: this build has no CUDA backend (nvcc was not found when it was configured); use --cpu");
#endif
}

}  // namespace dsuf

// The CUDA backend: the V4.1 forward on the GPU behind the same Backend interface as the CPU
// reference, checked against it (tests/backend/cuda_*). Weights live on the device in their packed
// checkpoint formats; Engram tables stay in pinned host memory the GPU reads directly. This header
// has no CUDA types, so the engine and tools include it without nvcc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"  // CpuNumerics: the same switches, so both run the same numerics
#include "model/weights.h"

namespace dsuf {

struct CudaOptions {
  int device = 0;
  int64_t max_context = 4096;  // capacity of each sequence's compressed-KV pools
  int max_chunk = 512;         // largest prefill chunk per forward (longer inputs are split)
  CpuNumerics numerics;
  int max_batch = 8;           // sequences held at once: the memory plan reserves their pools
  // Tensor parallelism (docs/tp.md): one rank per listed GPU. Empty: the one GPU `device`. A single
  // device runs the same partitioned code at world size 1 (no collectives).
  std::vector<int> devices;
  // Prints on stderr what loading takes: the Engram tables, each rank's weights (bytes, seconds).
  bool progress = false;
};

// Device memory the backend will need, computed from the config before anything is uploaded.
struct CudaMemoryPlan {
  size_t weights = 0;       // packed weights on the device (Engram tables stay in host memory)
  size_t per_sequence = 0;  // one sequence's pools at max_context
  size_t sequences = 0;     // max_batch × per_sequence
  size_t workspace = 0;     // activations for one max_chunk forward
  size_t host_pinned = 0;   // Engram tables in pinned host memory
  size_t total() const { return weights + sequences + workspace; }
  std::string describe() const;
};
// Per GPU: `rank` of opt.devices (tensor parallel), 0 for one GPU.
CudaMemoryPlan plan_cuda_memory(const LoadedModel& model, const CudaOptions& opt, int rank = 0);
CudaMemoryPlan plan_cuda_memory(const ModelConfig& config, const CudaOptions& opt, int rank = 0);

class CudaBackend final : public Backend {
 public:
  CudaBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CudaOptions opt = {});
  // A synthetic model: every weight drawn on the device (Engram tables in pinned host memory) from
  // `seed`, no checkpoint. For benchmarks at sizes no test checkpoint has. `config` must outlive it.
  CudaBackend(const ModelConfig& config, std::vector<int32_t> compressed_ids, CudaOptions opt, uint64_t seed);
  ~CudaBackend() override;

  const ModelConfig& config() const override;
  const KvLayout& layout() const override;
  SequenceState new_sequence() const override;
  void forward(std::span<ForwardItem> batch) override;
  // Copies a sequence's device pools into its host fields (for serialization and checks).
  void download(SequenceState& st) const override;
  // A sequence that already holds `pos` tokens of random but valid packed KV (benchmarks).
  SequenceState synthetic_sequence(int64_t pos, uint64_t seed);
  // GPU time of the last decode step replayed as a graph, in milliseconds (0 if none).
  double last_graph_ms() const;
  // Per-component timing (benchmarks): while on, steps run without graphs and CUDA events between
  // the parts of the step (embedding, Engram, mHC + norms, attention, indexer + compressor, MoE,
  // head + sampling) give each part's GPU time; component_ms() returns the last step's.
  void set_component_timing(bool on);
  std::vector<std::pair<std::string, double>> component_ms() const;

  // Device memory the weights take, in bytes (on GPU `rank`).
  size_t weight_bytes(int rank = 0) const;
  // Ranks (GPUs) the model is split over.
  int world_size() const;

 private:
  struct Impl;
  struct Tp;
  void init(const ModelConfig& cfg, const LoadedModel* model, std::vector<int32_t> ids, CudaOptions opt,
            uint64_t seed);
  void load_ranks(const ModelConfig& cfg, const LoadedModel* model, const std::vector<int32_t>& ids,
                  const CudaOptions& opt, uint64_t seed);
  std::vector<std::unique_ptr<Impl>> ranks_;  // one per GPU; ranks_[0] answers the host-side questions
  std::unique_ptr<Tp> tp_;                    // communicators and rank threads (more than one GPU)
};

// True when a CUDA device is present and usable.
bool cuda_available();

}  // namespace dsuf

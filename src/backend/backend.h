// The Backend interface: one forward over a batch of sequence chunks. The CPU reference
// (backend/cpu) and the CUDA backend (backend/cuda) implement it; the engine never knows which runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/sampling.h"
#include "model/config.h"
#include "model/kv_layout.h"

namespace dsuf {

// One sequence's slice of a step: its state, the next tokens to consume (a prefill chunk of any
// length, or one decode token), which rows get logits, and whether the backend samples a token.
struct ForwardItem {
  enum class Logits { kNone, kLast, kAll };
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  Logits want = Logits::kLast;           // rows whose logits are computed
  std::vector<float>* logits = nullptr;  // when set, receives them: rows × vocab (FP32)
  // Sampling on the backend: when `token` is set, the last row's logits (want must not be kNone) are
  // sampled where they were computed, by core/sampling.h's definition with `sampling` and `draw` (the
  // request's count of earlier draws), and the id is written there. Without `logits`, only the id
  // comes back to the host.
  SamplingParams sampling{};
  uint64_t draw = 0;
  int32_t* token = nullptr;
  // Checking aid: when set, receives after every layer the residual streams of this chunk
  // ([tokens][hc][hidden], FP32), so two backends can be compared layer by layer.
  std::vector<std::vector<float>>* trace = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const KvLayout& layout() const = 0;
  virtual SequenceState new_sequence() const { return SequenceState::empty(layout()); }
  // Consumes every item's tokens (advancing its state) and writes the requested logits and tokens.
  virtual void forward(std::span<ForwardItem> batch) = 0;
  // Makes the state's host pools current (a backend that keeps them on a device copies them back;
  // CudaBackend's download has this signature). Host-resident backends have nothing to do.
  virtual void download(SequenceState& state) const { (void)state; }
};

}  // namespace dsuf

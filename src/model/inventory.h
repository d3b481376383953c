// The tensors a V4.1 checkpoint must hold, derived from ModelConfig (model-spec §2.3). One list
// serves the loader (every tensor checked by name, dtype and shape) and the tiny-checkpoint writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace dsuf {

// How a logical weight is stored.
enum class WeightKind {
  kBf16,       // <name> BF16
  kF32,        // <name> F32
  kFp8Linear,  // <name>.weight F8_E4M3 [out, in] + <name>.scale F8_E8M0 [out/32, in/32]
  kFp4Linear,  // <name>.weight I8 [out, in/2] (two E2M1 per byte) + <name>.scale F8_E8M0 [out, in/32]
  kFp8Rows,    // <name>.weight F8_E4M3 [rows, cols] + <name>.scale F8_E8M0 [rows, cols/32] (Engram)
};

// How the tiny writer draws a weight (real checkpoints ignore it).
enum class WeightInit {
  kLinear,     // N(0, 1/in): keeps activations at unit scale
  kNorm,       // 1 + N(0, 0.1): RMSNorm weights
  kEmbed,      // N(0, 1)
  kHead,       // N(0, 2.5^2/in): logits with a few units of spread
  kHcFn,       // N(0, 0.1^2 / in)
  kHcBase,     // N(0, 1)
  kHcScale,    // U(0.5, 1.5)
  kSink,       // N(0, 1)
  kBias,       // N(0, 0.01^2)
  kRouter,     // N(0, 1/in)
  kSmall,      // N(0, 0.05^2)
};

struct WeightSpec {
  std::string name;             // for kFp8*/kFp4: without the .weight/.scale suffix
  WeightKind kind;
  std::vector<int64_t> shape;   // logical shape ([out, in] for linears)
  WeightInit init;
};

// One physical tensor as the checkpoint stores it.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

std::vector<WeightSpec> expected_weights(const ModelConfig& cfg);
std::vector<TensorSpec> physical_tensors(const WeightSpec& w);
std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg);

// Checks every expected tensor against the checkpoint: presence, dtype and shape. Throws one
// dsuf::Error listing the problems (each naming the tensor and its file); returns the names of
// tensors the checkpoint holds that the inventory does not know (callers may warn).
std::vector<std::string> check_inventory(const Checkpoint& ckpt, const ModelConfig& cfg);

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace dsuf

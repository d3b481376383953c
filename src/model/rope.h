// RoPE frequencies and angles (model-spec §3.6), computed once on the host for both backends so
// that the CPU reference and the GPU rotate by the very same cos/sin values.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsuf {

// θ_i = base^(−2i/dim) in FP32; with `yarn`, frequencies below the correction range are divided by
// the factor and those inside it blended linearly (no attention factor).
std::vector<float> rope_inv_freq(int dim, double base, const RopeScaling* yarn);

// cs[2i] = cos(pos·θ_i), cs[2i+1] = sin(pos·θ_i), the angle rounded to FP32 first as the reference does.
void rope_cos_sin(int64_t pos, const std::vector<float>& inv_freq, float* cs);

}  // namespace dsuf

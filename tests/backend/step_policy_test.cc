// The CUDA backend's launch policies (backend/cuda/step_policy.h), on the CPU.
#include <gtest/gtest.h>

#include "backend/cuda/step_policy.h"

namespace dsuf::cuda {
namespace {

// DSUF_PRIORITY: auto (since session 35) and none never raise the latency-bound kernels, latency
// always.
TEST(StepPolicy, PriorityOnlyWhenAsked) {
  EXPECT_FALSE(latency_priority_for(PriorityMode::kAuto));
  EXPECT_TRUE(latency_priority_for(PriorityMode::kLatency));
  EXPECT_FALSE(latency_priority_for(PriorityMode::kNone));
}

}  // namespace
}  // namespace dsuf::cuda

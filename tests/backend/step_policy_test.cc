// The CUDA backend's shape-only launch policies (backend/cuda/step_policy.h), on the CPU.
#include <gtest/gtest.h>

#include "backend/cuda/step_policy.h"

namespace dsuf::cuda {
namespace {

// DSUF_PRIORITY: auto (since session 35) and none never raise the latency-bound kernels, latency
// always, whatever the rows.
TEST(StepPolicy, PriorityOnlyWhenAsked) {
  for (int64_t rows : {1, 4, 64, 512}) {
    EXPECT_FALSE(latency_priority_for(PriorityMode::kAuto, rows)) << rows;
    EXPECT_TRUE(latency_priority_for(PriorityMode::kLatency, rows)) << rows;
    EXPECT_FALSE(latency_priority_for(PriorityMode::kNone, rows)) << rows;
  }
}

}  // namespace
}  // namespace dsuf::cuda

// The CUDA backend's shape-only launch policies (backend/cuda/step_policy.h), on the CPU.
#include <gtest/gtest.h>

#include "backend/cuda/step_policy.h"

namespace dsuf::cuda {
namespace {

// DSUF_PRIORITY: auto raises the latency-bound kernels for one-row steps only; latency always,
// none never, whatever the rows.
TEST(StepPolicy, PriorityAutoIsForOneRowSteps) {
  EXPECT_TRUE(latency_priority_for(PriorityMode::kAuto, 1));
  EXPECT_FALSE(latency_priority_for(PriorityMode::kAuto, 2));
  EXPECT_FALSE(latency_priority_for(PriorityMode::kAuto, 16));
  EXPECT_FALSE(latency_priority_for(PriorityMode::kAuto, 64));
  for (int64_t rows : {1, 4, 64, 512}) {
    EXPECT_TRUE(latency_priority_for(PriorityMode::kLatency, rows)) << rows;
    EXPECT_FALSE(latency_priority_for(PriorityMode::kNone, rows)) << rows;
  }
}

}  // namespace
}  // namespace dsuf::cuda

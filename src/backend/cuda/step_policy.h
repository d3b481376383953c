// Launch policies of a step, plain C++ so that the CPU tests check them
// (tests/backend/step_policy_test.cc); kernels.cu reads the environment and applies them.
#pragma once

namespace dsuf::cuda {

// DSUF_PRIORITY=auto|latency|none, in that order.
enum class PriorityMode { kAuto = 0, kLatency = 1, kNone = 2 };

// Whether a step launches its latency-bound kernels at the device's greatest priority. auto: never,
// since session 35 — the priority had measured −0.02 ms at batch 1 (v21) and +0.7 ms at batch 16
// and +1.5 ms at batch 64 (v22), so auto took it for one-row steps only (the policy then read the
// step's rows); on v46's kernels it costs at batch 1 too (none against it: −0.010, −0.019 at 8K in
// two calls, −0.014 at 128K; docs/perf.md session 35). `latency` still forces it.
constexpr bool latency_priority_for(PriorityMode mode) { return mode == PriorityMode::kLatency; }

}  // namespace dsuf::cuda

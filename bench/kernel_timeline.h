// Where a decode step's time goes, from the GPU's own timestamps of every kernel and copy (CUPTI
// activity records of a graph replay; bench_decode --timeline). Nsight Compute times kernels one at
// a time at their own pace; this sees the step as it runs: the kernels on both streams, how they
// overlap, and the gaps in which nothing runs at all (launch latency and dependency waits).
//
// The analysis is plain C++ (tested on the CPU); the capture needs CUPTI and a GPU.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dsuf::bench {

struct TimelineRecord {
  std::string name;  // the kernel's name, simplified (simplify_kernel_name), or "memcpy HtoD" etc.
  uint64_t start = 0, end = 0;  // ns, the GPU's clock
  uint32_t stream = 0;
};

// One step's time, split so that the parts add up to its span (first start to last end):
//   share  each instant in which k records run is split evenly among them (k = 1: the record alone
//          is on the critical path at that instant);
//   gap    an instant in which nothing runs is charged to the record that starts when it ends (the
//          launch latency or dependency wait before it).
struct TimelineEntry {
  std::string name;
  int count = 0;
  double total_us = 0;  // Σ (end − start), as if serialized
  double share_us = 0;
  double gap_us = 0;
};
struct TimelineSummary {
  double span_us = 0, busy_us = 0, idle_us = 0, serialized_us = 0;
  int records = 0;
  std::vector<TimelineEntry> entries;  // by share + gap, largest first
};

// "void dsuf::cuda::(anonymous namespace)::k_fp8_gemv<2, true, true, 0>(const unsigned char*, ...)"
// → "k_fp8_gemv<2, true, true, 0>": no return type, namespaces or parameter list.
std::string simplify_kernel_name(const std::string& demangled);

// Records sorted by start, step i holding those that start in [begins[i], begins[i+1]) (begins: the
// host's clock, the same as the records', read before each step is submitted; ascending). Records
// before begins[0] are dropped.
std::vector<std::vector<TimelineRecord>> split_steps(std::vector<TimelineRecord> records,
                                                     const std::vector<uint64_t>& begins);

TimelineSummary summarize(const std::vector<TimelineRecord>& step);

// The summary as a table (the `top` largest entries, the rest as one line) and the records as CSV
// (name, stream, start and end in µs from the step's first start).
void print_summary(std::FILE* f, const TimelineSummary& s, int top);
// The records of a step from the `first`-th record whose name starts with `marker` (counting from 0,
// in start order) up to, not including, the (first + count)-th: start offset from that first
// record, duration, stream, name, one line each (a layer's chain of kernels, e.g. marker
// "k_collapse_norm", two occurrences a layer). Prints nothing when the step has too few markers.
void print_chain(std::FILE* f, const std::vector<TimelineRecord>& step, const std::string& marker, int first,
                 int count);
void write_csv(const std::string& path, const std::vector<std::vector<TimelineRecord>>& steps);

// CUPTI capture of kernels, copies and memsets between start() and stop(). available() is false
// when the build has no CUPTI (then start() fails with a clear error).
class TimelineCapture {
 public:
  static bool available();
  static uint64_t now();  // the records' clock, ns
  void start();
  std::vector<TimelineRecord> stop();
};

}  // namespace dsuf::bench

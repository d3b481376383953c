// The timeline analysis of bench_decode --timeline on hand-made records: names, step cuts, and the
// split of a step's span into shares and gaps.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernel_timeline.h"

namespace dsuf::bench {
namespace {

TimelineRecord rec(const char* name, uint64_t start, uint64_t end, uint32_t stream = 7) {
  return {name, start, end, stream};
}
const TimelineEntry& entry(const TimelineSummary& s, const std::string& name) {
  for (const TimelineEntry& e : s.entries)
    if (e.name == name) return e;
  ADD_FAILURE() << "no entry " << name;
  static const TimelineEntry none;
  return none;
}

TEST(Timeline, SimplifiesDemangledNames) {
  EXPECT_EQ(simplify_kernel_name("void dsuf::cuda::(anonymous namespace)::k_fp8_gemv<2, true, true, 0>(unsigned "
                                 "char const*, float*, int)"),
            "k_fp8_gemv<2, true, true, 0>");
  EXPECT_EQ(simplify_kernel_name("void dsuf::cuda::k_hc_mix<4>(float const*, float const*, int)"), "k_hc_mix<4>");
  // Qualified names inside template arguments stay; only the kernel's own qualifiers go.
  EXPECT_EQ(simplify_kernel_name("void ns::k<ns::A::B, 3>(ns::A)"), "k<ns::A::B, 3>");
  EXPECT_EQ(simplify_kernel_name("memcpy HtoD"), "memcpy HtoD");
  EXPECT_EQ(simplify_kernel_name("_Z3fooPf"), "_Z3fooPf");  // not demangled: left as it is
}

TEST(Timeline, SplitsStepsAtTheirBegins) {
  // Two steps begun at 0 and 1 ms; a record that starts before the first begin is dropped, one that
  // starts in step 0 and ends in step 1's time stays in step 0.
  std::vector<TimelineRecord> r = {rec("b", 20'000, 30'000),          rec("a", 10'000, 1'100'000, 1),
                                   rec("early", 0, 5'000),           rec("d", 1'200'000, 1'210'000),
                                   rec("c", 105'000, 110'000),      rec("e", 1'000'000, 1'220'000)};
  const auto steps = split_steps(r, {1'000, 1'000'000});
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].size(), 3u);
  EXPECT_EQ(steps[0][0].name, "a");  // sorted by start
  EXPECT_EQ(steps[0][1].name, "b");
  EXPECT_EQ(steps[0][2].name, "c");
  ASSERT_EQ(steps[1].size(), 2u);
  EXPECT_EQ(steps[1][0].name, "e");  // starts exactly at the begin
  EXPECT_EQ(split_steps(r, {0}).at(0).size(), r.size());
  EXPECT_THROW(split_steps(r, {5, 1}), std::exception);
}

TEST(Timeline, SharesAndGapsAddUpToTheSpan) {
  // a [0, 10) alone, a and b [10, 20) together, b [20, 30) alone, nothing [30, 34), c [34, 40),
  // c and d both start after the gap [40, 44)... d [44, 50).
  const std::vector<TimelineRecord> step = {rec("a", 0, 20'000), rec("b", 10'000, 30'000, 8),
                                            rec("c", 34'000, 40'000), rec("d", 44'000, 50'000),
                                            rec("d", 44'000, 46'000, 8)};
  const TimelineSummary s = summarize(step);
  EXPECT_EQ(s.records, 5);
  EXPECT_DOUBLE_EQ(s.span_us, 50.0);
  EXPECT_DOUBLE_EQ(s.idle_us, 8.0);
  EXPECT_DOUBLE_EQ(s.busy_us, 42.0);
  EXPECT_DOUBLE_EQ(s.serialized_us, 20.0 + 20.0 + 6.0 + 6.0 + 2.0);
  EXPECT_DOUBLE_EQ(entry(s, "a").share_us, 15.0);
  EXPECT_DOUBLE_EQ(entry(s, "b").share_us, 15.0);
  EXPECT_DOUBLE_EQ(entry(s, "c").gap_us, 4.0);
  EXPECT_DOUBLE_EQ(entry(s, "c").share_us, 6.0);
  // The two d records start together after [40, 44): the gap is split between them (one name), and
  // [44, 46) is split between the two.
  EXPECT_DOUBLE_EQ(entry(s, "d").gap_us, 4.0);
  EXPECT_DOUBLE_EQ(entry(s, "d").share_us, 6.0);
  EXPECT_EQ(entry(s, "d").count, 2);
  EXPECT_DOUBLE_EQ(entry(s, "d").total_us, 8.0);
  double sum = 0;
  for (const TimelineEntry& e : s.entries) sum += e.share_us + e.gap_us;
  EXPECT_DOUBLE_EQ(sum, s.span_us);
  // Largest share + gap first.
  for (size_t i = 1; i < s.entries.size(); ++i)
    EXPECT_GE(s.entries[i - 1].share_us + s.entries[i - 1].gap_us, s.entries[i].share_us + s.entries[i].gap_us);
}

TEST(Timeline, ZeroLengthAndNestedRecords) {
  // A zero-length record never runs; a record nested inside another shares its time.
  const std::vector<TimelineRecord> step = {rec("outer", 0, 30'000), rec("inner", 10'000, 20'000, 8),
                                            rec("blip", 15'000, 15'000, 9)};
  const TimelineSummary s = summarize(step);
  EXPECT_DOUBLE_EQ(s.idle_us, 0.0);
  EXPECT_DOUBLE_EQ(entry(s, "outer").share_us, 25.0);
  EXPECT_DOUBLE_EQ(entry(s, "inner").share_us, 5.0);
  EXPECT_DOUBLE_EQ(entry(s, "blip").share_us, 0.0);
  EXPECT_THROW(summarize({rec("bad", 10, 5)}), std::exception);
}

TEST(Timeline, PrintsAChainBetweenMarkers) {
  const std::vector<TimelineRecord> step = {rec("k_b", 5'000, 6'000),    rec("k_mark<4>", 1'000, 2'000),
                                            rec("k_c", 8'000, 9'500, 3), rec("k_mark<4>", 7'000, 7'500),
                                            rec("k_d", 10'000, 11'000),  rec("k_mark<4>", 12'000, 12'100)};
  char buf[2048] = {};
  std::FILE* f = fmemopen(buf, sizeof buf, "w");
  ASSERT_NE(f, nullptr);
  print_chain(f, step, "k_mark", 1, 1);  // from the second marker up to the third
  std::fclose(f);
  const std::string out = buf;
  EXPECT_NE(out.find("       0.0       0.5       7  k_mark<4>"), std::string::npos) << out;
  EXPECT_NE(out.find("       1.0       1.5       3  k_c"), std::string::npos) << out;
  EXPECT_NE(out.find("       3.0       1.0       7  k_d"), std::string::npos) << out;
  EXPECT_EQ(out.find("k_b"), std::string::npos) << out;
  EXPECT_EQ(out.find("12.1"), std::string::npos) << out;  // the third marker is not printed
  char none[256] = {};
  f = fmemopen(none, sizeof none, "w");
  print_chain(f, step, "k_mark", 5, 1);  // too few markers: nothing
  std::fclose(f);
  EXPECT_STREQ(none, "");
}

TEST(Timeline, PrintsAndWritesTheRecords) {
  const std::vector<std::vector<TimelineRecord>> steps = {{rec("k<1>", 1'000, 3'000), rec("m \"q\"", 3'500, 4'000)}};
  const TimelineSummary s = summarize(steps[0]);
  char buf[4096] = {};
  std::FILE* f = fmemopen(buf, sizeof buf, "w");
  ASSERT_NE(f, nullptr);
  print_summary(f, s, 1);
  std::fclose(f);
  const std::string out = buf;
  EXPECT_NE(out.find("span 3.0 µs = busy 2.5 + idle 0.5"), std::string::npos) << out;
  EXPECT_NE(out.find("(the rest)"), std::string::npos) << out;
  const std::string path = ::testing::TempDir() + "timeline_test.csv";
  write_csv(path, steps);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "step,stream,start_us,end_us,name\n0,7,0,2,\"k<1>\"\n0,7,2.5,3,\"m 'q'\"\n");
}

}  // namespace
}  // namespace dsuf::bench

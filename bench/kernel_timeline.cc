#include "kernel_timeline.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "core/error.h"

namespace dsuf::bench {

std::string simplify_kernel_name(const std::string& demangled) {
  std::string s = demangled;
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  // The parameter list: the first '(' outside template arguments that does not open
  // "(anonymous namespace)".
  const std::string anon = "(anonymous namespace)";
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>') depth = std::max(0, depth - 1);
    else if (c == '(' && depth == 0) {
      if (s.compare(i, anon.size(), anon) == 0) {
        i += anon.size() - 1;
        continue;
      }
      cut = i;
      break;
    }
  }
  if (cut != std::string::npos) s = s.substr(0, cut);
  // The qualifiers: everything up to the last "::" outside template arguments.
  depth = 0;
  size_t last = std::string::npos;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>') depth = std::max(0, depth - 1);
    else if (c == ':' && s[i + 1] == ':' && depth == 0) last = i;
  }
  if (last != std::string::npos) s = s.substr(last + 2);
  return s;
}

std::vector<std::vector<TimelineRecord>> split_steps(std::vector<TimelineRecord> records,
                                                     const std::vector<uint64_t>& begins) {
  DSUF_CHECK(std::is_sorted(begins.begin(), begins.end()), "timeline: step begins out of order");
  std::sort(records.begin(), records.end(), [](const TimelineRecord& a, const TimelineRecord& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  std::vector<std::vector<TimelineRecord>> steps(begins.size());
  for (TimelineRecord& r : records) {
    const auto it = std::upper_bound(begins.begin(), begins.end(), r.start);
    if (it != begins.begin()) steps[size_t(it - begins.begin()) - 1].push_back(std::move(r));
  }
  return steps;
}

TimelineSummary summarize(const std::vector<TimelineRecord>& step) {
  TimelineSummary s;
  s.records = int(step.size());
  if (step.empty()) return s;
  for (const TimelineRecord& r : step)
    DSUF_CHECK(r.end >= r.start, "timeline: record ", r.name, " ends before it starts");
  // Boundaries in time order; at each, the records that start and end there.
  std::vector<uint64_t> times;
  for (const TimelineRecord& r : step) times.push_back(r.start), times.push_back(r.end);
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  std::vector<size_t> by_start(step.size()), by_end(step.size());
  for (size_t i = 0; i < step.size(); ++i) by_start[i] = by_end[i] = i;
  std::sort(by_start.begin(), by_start.end(), [&](size_t a, size_t b) { return step[a].start < step[b].start; });
  std::sort(by_end.begin(), by_end.end(), [&](size_t a, size_t b) { return step[a].end < step[b].end; });

  std::map<std::string, TimelineEntry> per;
  for (const TimelineRecord& r : step) {
    TimelineEntry& e = per[r.name];
    e.name = r.name, e.count += 1, e.total_us += double(r.end - r.start) / 1e3;
    s.serialized_us += double(r.end - r.start) / 1e3;
  }
  std::vector<size_t> active;
  size_t si = 0, ei = 0;
  for (size_t t = 0; t + 1 < times.size(); ++t) {
    const uint64_t a = times[t], b = times[t + 1];
    while (ei < by_end.size() && step[by_end[ei]].end <= a) {  // ended (zero-length ones too)
      const size_t k = by_end[ei++];
      active.erase(std::remove(active.begin(), active.end(), k), active.end());
    }
    while (si < by_start.size() && step[by_start[si]].start <= a) {
      const size_t k = by_start[si++];
      if (step[k].end > a) active.push_back(k);
    }
    const double dt = double(b - a) / 1e3;
    if (!active.empty()) {
      s.busy_us += dt;
      for (size_t k : active) per[step[k].name].share_us += dt / double(active.size());
    } else {
      s.idle_us += dt;
      std::vector<size_t> next;  // the records that start at b end the gap
      for (size_t j = si; j < by_start.size() && step[by_start[j]].start == b; ++j) next.push_back(by_start[j]);
      for (size_t k : next) per[step[k].name].gap_us += dt / double(next.size());
    }
  }
  s.span_us = double(times.back() - times.front()) / 1e3;
  for (auto& [name, e] : per) s.entries.push_back(e);
  std::sort(s.entries.begin(), s.entries.end(), [](const TimelineEntry& a, const TimelineEntry& b) {
    return a.share_us + a.gap_us != b.share_us + b.gap_us ? a.share_us + a.gap_us > b.share_us + b.gap_us
                                                           : a.name < b.name;
  });
  return s;
}

void print_summary(std::FILE* f, const TimelineSummary& s, int top) {
  std::fprintf(f, "    timeline: %d records, span %.1f µs = busy %.1f + idle %.1f (nothing running); kernels"
                  " serialized %.1f µs (%.2f× overlap)\n",
               s.records, s.span_us, s.busy_us, s.idle_us, s.serialized_us,
               s.busy_us > 0 ? s.serialized_us / s.busy_us : 0.0);
  std::fprintf(f, "    %-44s %6s %10s %10s %10s %10s %7s\n", "kernel", "count", "total µs", "share µs", "gap µs",
               "share+gap", "% span");
  TimelineEntry rest{.name = "(the rest)"};
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const TimelineEntry& e = s.entries[i];
    if (int(i) >= top) {
      rest.count += e.count, rest.total_us += e.total_us, rest.share_us += e.share_us, rest.gap_us += e.gap_us;
      continue;
    }
    std::string n = e.name.size() > 44 ? e.name.substr(0, 41) + "..." : e.name;
    std::fprintf(f, "    %-44s %6d %10.1f %10.1f %10.1f %10.1f %6.1f%%\n", n.c_str(), e.count, e.total_us, e.share_us,
                 e.gap_us, e.share_us + e.gap_us, s.span_us > 0 ? 100.0 * (e.share_us + e.gap_us) / s.span_us : 0.0);
  }
  if (rest.count > 0)
    std::fprintf(f, "    %-44s %6d %10.1f %10.1f %10.1f %10.1f %6.1f%%\n", rest.name.c_str(), rest.count,
                 rest.total_us, rest.share_us, rest.gap_us, rest.share_us + rest.gap_us,
                 s.span_us > 0 ? 100.0 * (rest.share_us + rest.gap_us) / s.span_us : 0.0);
}

void print_chain(std::FILE* f, const std::vector<TimelineRecord>& step, const std::string& marker, int first,
                 int count) {
  std::vector<const TimelineRecord*> sorted;
  for (const TimelineRecord& r : step) sorted.push_back(&r);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TimelineRecord* a, const TimelineRecord* b) { return a->start < b->start; });
  std::vector<size_t> at;  // indices of the markers
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i]->name.rfind(marker, 0) == 0) at.push_back(i);
  if (first < 0 || count <= 0 || at.size() < size_t(first) + 1) return;
  const size_t lo = at[size_t(first)];
  const size_t hi = size_t(first + count) < at.size() ? at[size_t(first + count)] : sorted.size();
  const uint64_t t0 = sorted[lo]->start;
  std::fprintf(f, "    %10s %9s %7s  %s\n", "start µs", "µs", "stream", "kernel");
  for (size_t i = lo; i < hi; ++i) {
    const TimelineRecord& r = *sorted[i];
    std::fprintf(f, "    %10.1f %9.1f %7u  %s\n", double(r.start - t0) / 1e3, double(r.end - r.start) / 1e3, r.stream,
                 r.name.c_str());
  }
}

void write_csv(const std::string& path, const std::vector<std::vector<TimelineRecord>>& steps) {
  std::ofstream o(path);
  DSUF_CHECK(bool(o), "timeline: cannot write ", path);
  o << "step,stream,start_us,end_us,name\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].empty()) continue;
    const uint64_t t0 = steps[i].front().start;
    for (const TimelineRecord& r : steps[i]) {
      std::string n = r.name;
      std::replace(n.begin(), n.end(), '"', '\'');
      o << i << ',' << r.stream << ',' << double(r.start - t0) / 1e3 << ',' << double(r.end - t0) / 1e3 << ",\"" << n
        << "\"\n";
    }
  }
  DSUF_CHECK(bool(o), "timeline: writing ", path, " failed");
}

}  // namespace dsuf::bench

// TimelineCapture: CUPTI activity records (concurrent kernels, copies, memsets) into TimelineRecords.
#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "kernel_timeline.h"

#if defined(DSUF_HAVE_CUPTI)
#include <cxxabi.h>
#include <cupti.h>
#endif

namespace dsuf::bench {

#if defined(DSUF_HAVE_CUPTI)
namespace {

std::mutex g_mu;
std::vector<TimelineRecord>* g_out = nullptr;  // the running capture's records
size_t g_dropped = 0;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  fail("CUPTI: ", what, ": ", msg ? msg : "unknown error");
}

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return simplify_kernel_name(status == 0 && d ? d.get() : name);
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = size_t(8) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* rec = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_out->push_back({demangle(k->name), k->start, k->end, k->streamId});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      g_out->push_back({copy_kind(m->copyKind), m->start, m->end, m->streamId});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      g_out->push_back({"memset", m->start, m->end, m->streamId});
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET};
std::vector<TimelineRecord> g_records;

}  // namespace

bool TimelineCapture::available() { return true; }
uint64_t TimelineCapture::now() {
  uint64_t t = 0;
  check(cuptiGetTimestamp(&t), "timestamp");
  return t;
}

void TimelineCapture::start() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    DSUF_CHECK(!g_out, "timeline: a capture is already running");
    g_records.clear(), g_dropped = 0, g_out = &g_records;
  }
  static const bool registered = [] {
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
    return true;
  }();
  (void)registered;
  for (CUpti_ActivityKind k : kKinds) check(cuptiActivityEnable(k), "enable activity");
}

std::vector<TimelineRecord> TimelineCapture::stop() {
  check(cuptiActivityFlushAll(1), "flush");
  for (CUpti_ActivityKind k : kKinds) check(cuptiActivityDisable(k), "disable activity");
  std::lock_guard<std::mutex> lock(g_mu);
  g_out = nullptr;
  DSUF_CHECK(g_dropped == 0, "timeline: CUPTI dropped ", g_dropped, " records");
  return std::move(g_records);
}

#else

bool TimelineCapture::available() { return false; }
uint64_t TimelineCapture::now() { return 0; }
void TimelineCapture::start() { fail("timeline: this build has no CUPTI (CUDA::cupti was not found)"); }
std::vector<TimelineRecord> TimelineCapture::stop() { return {}; }

#endif

}  // namespace dsuf::bench

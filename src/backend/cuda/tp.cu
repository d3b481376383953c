// Tensor parallelism: NCCL loaded at run time, the exchange kernels (pure copies: exactness does
// not depend on the split) and the per-rank thread pool. Layouts: activations row-major FP32.
#include "backend/cuda/tp.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/check.h"
#include "core/error.h"

#ifdef DSUF_HAVE_NCCL
#include <nccl.h>
#endif

namespace dsuf::cuda {

bool nccl_compiled() {
#ifdef DSUF_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef DSUF_HAVE_NCCL
namespace {
// The few NCCL entry points used, resolved once from libnccl.so.2.
struct Nccl {
  std::string path, tried;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* p = std::getenv("DSUF_NCCL_LIB")) c.push_back(p);
  c.push_back("libnccl.so.2");  // LD_LIBRARY_PATH, the loader cache
  for (const char* pattern :
       {"/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
        "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
        "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
        "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/root/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) c.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return c;
}

const Nccl& nccl() {
  static const Nccl lib = [] {
    Nccl n;
    void* h = nullptr;
    for (const std::string& c : candidates()) {
      n.tried += (n.tried.empty() ? "" : ", ") + c;
      if ((h = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL))) {
        n.path = c;
        break;
      }
    }
    if (!h)
      fail("tensor parallelism needs NCCL: libnccl.so.2 not found (tried ", n.tried,
           "); set DSUF_NCCL_LIB to its path or add its folder to LD_LIBRARY_PATH (pip package nvidia-nccl-cu13: "
           "<site-packages>/nvidia/nccl/lib)");
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) fail("NCCL library ", n.path, " lacks ", name);
    };
    sym(n.get_version, "ncclGetVersion");
    sym(n.error_string, "ncclGetErrorString");
    sym(n.init_all, "ncclCommInitAll");
    sym(n.destroy, "ncclCommDestroy");
    sym(n.abort, "ncclCommAbort");
    sym(n.all_gather, "ncclAllGather");
    sym(n.broadcast, "ncclBroadcast");
    sym(n.group_start, "ncclGroupStart");
    sym(n.group_end, "ncclGroupEnd");
    return n;
  }();
  return lib;
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL error in ", what, ": ", nccl().error_string(r), " (", int(r), ")");
}
ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }
}  // namespace

std::vector<std::unique_ptr<TpComm>> TpComm::create_all(const std::vector<int>& devices) {
  DSUF_CHECK(!devices.empty() && int(devices.size()) <= kMaxTpRanks, "tensor parallelism over ", devices.size(),
             " GPUs (at most ", kMaxTpRanks, ")");
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (unset only: a value given wins)
  // Connect every peer at init, not lazily inside the first (possibly graph-captured) collective.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  // Captured collectives use NCCL's own buffers, not registrations of ours (messages are small).
  setenv("NCCL_GRAPH_REGISTER", "0", 0);
  const Nccl& n = nccl();
  int version = 0;
  check_nccl(n.get_version(&version), "ncclGetVersion");
  std::fprintf(stderr,
               "tensor parallel: %zu GPUs, NCCL %d from %s, NCCL_NVLS_ENABLE=%s NCCL_RUNTIME_CONNECT=%s "
               "NCCL_GRAPH_REGISTER=%s\n",
               devices.size(), version, n.path.c_str(), std::getenv("NCCL_NVLS_ENABLE"),
               std::getenv("NCCL_RUNTIME_CONNECT"), std::getenv("NCCL_GRAPH_REGISTER"));
  std::vector<ncclComm_t> comms(devices.size());
  check_nccl(n.init_all(comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<TpComm>> out;
  for (size_t r = 0; r < devices.size(); ++r) {
    out.emplace_back(new TpComm());
    out.back()->comm_ = comms[r];
    out.back()->rank_ = int(r);
    out.back()->world_ = int(devices.size());
  }
  return out;
}

TpComm::~TpComm() {
  if (comm_ && !aborted_) nccl().destroy(as_comm(comm_));
}
void TpComm::all_gather(const float* send, float* recv, size_t count, cudaStream_t s) {
  check_nccl(nccl().all_gather(send, recv, count, ncclFloat32, as_comm(comm_), s), "ncclAllGather");
}
void TpComm::broadcast(float* buf, size_t count, int root, cudaStream_t s) {
  check_nccl(nccl().broadcast(buf, buf, count, ncclFloat32, root, as_comm(comm_), s), "ncclBroadcast");
}
void TpComm::group_start() { check_nccl(nccl().group_start(), "ncclGroupStart"); }
void TpComm::group_end() { check_nccl(nccl().group_end(), "ncclGroupEnd"); }
void TpComm::abort() {
  if (!comm_ || aborted_) return;
  aborted_ = true;
  nccl().abort(as_comm(comm_));
}

#else  // no nccl.h at build time

std::vector<std::unique_ptr<TpComm>> TpComm::create_all(const std::vector<int>& devices) {
  fail("--gpus with ", devices.size(),
       " devices: this build has no tensor parallelism (nccl.h was not found when it was configured; set "
       "DSUF_NCCL_INCLUDE or install NCCL's headers and reconfigure); give one GPU");
}
TpComm::~TpComm() = default;
void TpComm::all_gather(const float*, float*, size_t, cudaStream_t) { fail("built without NCCL"); }
void TpComm::broadcast(float*, size_t, int, cudaStream_t) { fail("built without NCCL"); }
void TpComm::group_start() { fail("built without NCCL"); }
void TpComm::group_end() { fail("built without NCCL"); }
void TpComm::abort() {}

#endif

// ---- exchange ----------------------------------------------------------------------------------

int64_t ColSplit::max_count() const {
  int64_t m = 0;
  for (int r = 0; r < world; ++r) m = std::max(m, count(r));
  return m;
}
bool ColSplit::even() const {
  for (int r = 1; r < world; ++r)
    if (count(r) != count(0)) return false;
  return true;
}
ColSplit col_split(const std::vector<RowRange>& ranges) {
  DSUF_CHECK(!ranges.empty() && int(ranges.size()) <= kMaxTpRanks);
  ColSplit sp;
  sp.world = int(ranges.size());
  for (int r = 0; r < sp.world; ++r) {
    DSUF_CHECK(ranges[r].begin == (r ? ranges[r - 1].end : 0), "column ranges not contiguous");
    sp.begin[r] = ranges[r].begin;
  }
  sp.begin[sp.world] = ranges.back().end;
  return sp;
}

namespace {
constexpr int kThreads = 256;
int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

__global__ void k_pack_cols(const float* full, int64_t rows, int64_t ld, int64_t c0, int64_t cnt, float* out,
                            int64_t cmax) {
  const int64_t total = rows * cnt, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / cnt, c = i % cnt;
    out[r * cmax + c] = full[r * ld + c0 + c];
  }
}

// recv [world][rows][cmax] → full's columns of every rank but `skip`.
__global__ void k_unpack_cols(const float* recv, ColSplit sp, int64_t rows, int64_t ld, int64_t cmax, int skip,
                              float* full) {
  const int q = blockIdx.y;
  if (q == skip) return;
  const int64_t c0 = sp.begin[q], cnt = sp.begin[q + 1] - c0;
  const int64_t total = rows * cnt, stride = int64_t(gridDim.x) * blockDim.x;
  const float* src = recv + int64_t(q) * rows * cmax;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / cnt, c = i % cnt;
    full[r * ld + c0 + c] = src[r * cmax + c];
  }
}

// Row `row` of ye ← the owner's copy from recv [world][rows][D].
__global__ void k_select_expert_rows(const float* recv, const int32_t* ids, int64_t rows, int64_t D, int world, int me,
                                     float* ye) {
  const int64_t row = blockIdx.x;
  const int owner = ids[row] % world;
  if (owner == me) return;
  const float* src = recv + (int64_t(owner) * rows + row) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ye[row * D + d] = src[d];
}
}  // namespace

void gather_cols(TpComm* comm, const ColSplit& sp, float* full, int64_t rows, int64_t ld, float* send, float* recv,
                 cudaStream_t s) {
  if (!comm || comm->world() == 1 || rows == 0) return;
  DSUF_CHECK(sp.world == comm->world(), "column split for ", sp.world, " ranks on a world of ", comm->world());
  const int me = comm->rank();
  if (rows == 1 && sp.even()) {  // one row: each rank's columns are one contiguous block of the row
    comm->all_gather(full + sp.begin[me], full, size_t(sp.count(me)), s);
    return;
  }
  const int64_t cmax = sp.max_count();
  k_pack_cols<<<blocks_for(rows * sp.count(me)), kThreads, 0, s>>>(full, rows, ld, sp.begin[me], sp.count(me), send,
                                                                    cmax);
  DSUF_CUDA(cudaGetLastError());
  comm->all_gather(send, recv, size_t(rows * cmax), s);
  k_unpack_cols<<<dim3(blocks_for(rows * cmax), sp.world), kThreads, 0, s>>>(recv, sp, rows, ld, cmax, me, full);
  DSUF_CUDA(cudaGetLastError());
}

void gather_expert_rows(TpComm* comm, float* ye, const int32_t* ids, int64_t rows, int64_t D, float* recv, float* ys,
                        int64_t n, int ys_root, cudaStream_t s) {
  if (!comm || comm->world() == 1 || rows == 0) return;
  comm->group_start();
  if (ids) comm->all_gather(ye, recv, size_t(rows * D), s);
  comm->broadcast(ys, size_t(n * D), ys_root, s);
  comm->group_end();
  if (!ids) return;  // experts split by width: ye is whole already, only the shared expert moves
  k_select_expert_rows<<<int(rows), kThreads, 0, s>>>(recv, ids, rows, D, comm->world(), comm->rank(), ye);
  DSUF_CUDA(cudaGetLastError());
}

// ---- rank threads ------------------------------------------------------------------------------

RankPool::RankPool(std::vector<int> devices, std::function<void()> on_error)
    : devices_(std::move(devices)), on_error_(std::move(on_error)), errors_(devices_.size()) {
  for (int r = 1; r < int(devices_.size()); ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankPool::~RankPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankPool::run_one(int rank) {
  try {
    DSUF_CUDA(cudaSetDevice(devices_[rank]));
    (*task_)(rank);
  } catch (...) {
    errors_[rank] = std::current_exception();
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      first = !failed_;
      failed_ = true;
      if (first) first_failed_ = rank;
    }
    if (first && on_error_) on_error_();
  }
}

void RankPool::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_one(rank);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --pending_;
    }
    done_cv_.notify_all();
  }
}

void RankPool::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_) fail("tensor parallel: an earlier step failed on a rank (communicators aborted); restart");
    task_ = &fn;
    pending_ = int(devices_.size()) - 1;
    for (auto& e : errors_) e = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  run_one(0);
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    task_ = nullptr;
  }
  if (failed_) {
    const int r = first_failed_;
    try {
      std::rethrow_exception(errors_[r]);
    } catch (const std::exception& e) {
      fail("tensor parallel rank ", r, " (GPU ", devices_[r], "): ", e.what());
    }
  }
}

}  // namespace dsuf::cuda

#include "cluster/ucx_rma.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace dsuf::cluster {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'U', 'C', 'X', 'D', 'S', '1'};

// Context + worker. No registration cache: states are long-lived buffers mapped explicitly, once
// per transfer (Velo's advice).
struct Ucx {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;

  Ucx() {
    setenv("UCX_RCACHE_ENABLE", "n", 0);
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK)
      fail("ucx: cannot read its configuration");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    const ucs_status_t s = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) fail("ucx: ucp_init: ", ucs_status_string(s));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    if (ucs_status_t w = ucp_worker_create(ctx, &wp, &worker); w != UCS_OK) {
      ucp_cleanup(ctx);
      fail("ucx: ucp_worker_create: ", ucs_status_string(w));
    }
  }
  ~Ucx() {
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
  }
};

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

struct UcxExporter::Impl {
  Ucx ucx;
  std::string address;
  std::atomic<bool> stop{false};
  std::thread progress;
};

UcxExporter::UcxExporter() : impl_(std::make_unique<Impl>()) {
  ucp_address_t* a = nullptr;
  size_t n = 0;
  if (ucp_worker_get_address(impl_->ucx.worker, &a, &n) != UCS_OK) fail("ucx: no worker address");
  impl_->address.assign(reinterpret_cast<const char*>(a), n);
  ucp_worker_release_address(impl_->ucx.worker, a);
  int efd = -1;
  if (ucp_worker_get_efd(impl_->ucx.worker, &efd) != UCS_OK) fail("ucx: no event fd");
  // Emulated RMA (TCP) is served by the owner's worker: progress it, sleeping on the event fd.
  impl_->progress = std::thread([impl = impl_.get(), efd] {
    while (!impl->stop.load()) {
      if (ucp_worker_progress(impl->ucx.worker) != 0) continue;
      if (ucp_worker_arm(impl->ucx.worker) != UCS_OK) continue;
      pollfd p{efd, POLLIN, 0};
      ::poll(&p, 1, 100);
    }
  });
}

UcxExporter::~UcxExporter() {
  impl_->stop = true;
  ucp_worker_signal(impl_->ucx.worker);
  impl_->progress.join();
}

UcxExporter::Export UcxExporter::expose(const void* data, size_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(data);
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t s = ucp_mem_map(impl_->ucx.ctx, &mp, &memh); s != UCS_OK)
    fail("ucx: ucp_mem_map of ", bytes, " bytes: ", ucs_status_string(s),
         " (RDMA registration needs memlock: ulimit -l unlimited or IPC_LOCK)");
  void* rkey = nullptr;
  size_t rkey_len = 0;
  if (ucs_status_t s = ucp_rkey_pack(impl_->ucx.ctx, memh, &rkey, &rkey_len); s != UCS_OK) {
    ucp_mem_unmap(impl_->ucx.ctx, memh);
    fail("ucx: ucp_rkey_pack: ", ucs_status_string(s));
  }
  Export e;
  e.descriptor.append(kMagic, 8);
  put<uint64_t>(e.descriptor, reinterpret_cast<uint64_t>(data));
  put<uint64_t>(e.descriptor, bytes);
  put<uint32_t>(e.descriptor, static_cast<uint32_t>(impl_->address.size()));
  e.descriptor += impl_->address;
  put<uint32_t>(e.descriptor, static_cast<uint32_t>(rkey_len));
  e.descriptor.append(static_cast<const char*>(rkey), rkey_len);
  ucp_rkey_buffer_release(rkey);
  ucp_context_h ctx = impl_->ucx.ctx;
  e.mapping = std::shared_ptr<void>(
      memh, [ctx](void* m) { ucp_mem_unmap(ctx, static_cast<ucp_mem_h>(m)); });
  return e;
}

namespace {

// Progresses until the request completes or the deadline passes; UCS_INPROGRESS on timeout.
ucs_status_t wait(ucp_worker_h w, void* req, std::chrono::steady_clock::time_point deadline) {
  ucs_status_t s;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < deadline)
    ucp_worker_progress(w);
  return s;
}

}  // namespace

struct UcxImporter::Impl {
  Ucx ucx;
  std::mutex mu;  // one GET at a time through this worker
};

UcxImporter::UcxImporter() : impl_(std::make_unique<Impl>()) {}
UcxImporter::~UcxImporter() = default;

std::string UcxImporter::get(const std::string& d, std::string& out, int timeout_ms,
                             uint64_t max_bytes) {
  // Exact length checks before anything reaches UCX: a bad rkey can abort the process on IB.
  size_t off = 0;
  auto take = [&](void* dst, size_t n) {
    if (off + n > d.size()) return false;
    std::memcpy(dst, d.data() + off, n);
    off += n;
    return true;
  };
  char magic[8];
  uint64_t remote = 0, bytes = 0;
  uint32_t alen = 0, rlen = 0;
  if (!take(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !take(&remote, 8) ||
      !take(&bytes, 8) || !take(&alen, 4) || alen == 0 || off + alen > d.size())
    return "a malformed UCX descriptor";
  const std::string address = d.substr(off, alen);
  off += alen;
  if (!take(&rlen, 4) || rlen == 0 || off + rlen != d.size()) return "a malformed UCX descriptor";
  const std::string rkey_buf = d.substr(off, rlen);
  if (bytes > max_bytes)
    return detail::concat("a state of ", bytes, " bytes (limit ", max_bytes, ")");
  out.assign(bytes, '\0');

  std::lock_guard lk(impl_->mu);
  ucp_worker_h w = impl_->ucx.worker;
  // A forced close cancels whatever is outstanding on the endpoint; bounded, so a dead peer never
  // holds this thread.
  auto close = [w](ucp_ep_h e) {
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* c = ucp_ep_close_nbx(e, &cp);
    if (c && !UCS_PTR_IS_ERR(c)) {
      wait(w, c, std::chrono::steady_clock::now() + std::chrono::seconds(2));
      ucp_request_free(c);
    }
  };
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h eph = nullptr;
  if (ucs_status_t s = ucp_ep_create(w, &ep, &eph); s != UCS_OK)
    return std::string("ucp_ep_create: ") + ucs_status_string(s);
  std::string err;
  ucp_rkey_h rkey = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (ucs_status_t s = ucp_ep_rkey_unpack(eph, rkey_buf.data(), &rkey); s != UCS_OK) {
    err = std::string("ucp_ep_rkey_unpack: ") + ucs_status_string(s);
  } else {
    ucp_request_param_t rp{};
    void* req = bytes ? ucp_get_nbx(eph, out.data(), bytes, remote, rkey, &rp) : nullptr;
    if (UCS_PTR_IS_ERR(req)) {
      err = std::string("ucp_get_nbx: ") + ucs_status_string(UCS_PTR_STATUS(req));
      req = nullptr;
    } else if (req) {
      const ucs_status_t s = wait(w, req, deadline);
      if (s == UCS_INPROGRESS)
        err = "the UCX GET timed out";
      else if (s != UCS_OK)
        err = std::string("the UCX GET failed: ") + ucs_status_string(s);
    }
    if (err.empty()) {
      // The GET is complete locally only after a flush of the endpoint.
      ucp_request_param_t fp{};
      void* f = ucp_ep_flush_nbx(eph, &fp);
      if (UCS_PTR_IS_ERR(f)) {
        err = "ucp_ep_flush_nbx failed";
      } else if (f) {
        if (wait(w, f, deadline) != UCS_OK) err = "the UCX flush did not complete";
        ucp_request_free(f);  // released on completion if still pending (the close cancels it)
      }
    }
    // The usual case, nothing pending: the rkey goes before its endpoint. A GET still pending
    // (timeout) is cancelled by the forced close first, so nothing writes into `out` after it.
    if (!req || ucp_request_check_status(req) != UCS_INPROGRESS) {
      if (req) ucp_request_free(req);
      req = nullptr;
      ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
    close(eph);
    eph = nullptr;
    if (req) ucp_request_free(req);
    if (rkey) ucp_rkey_destroy(rkey);
  }
  if (eph) close(eph);
  if (!err.empty()) out.clear();
  return err;
}

}  // namespace dsuf::cluster

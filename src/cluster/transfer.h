// Moving a stored conversation between replicas: pull model over plain TCP, chunked. The puller
// sends its prompt and its identity; the owner answers with its own identity, then (when
// everything matches and it is under its cap) the longest stored state that prefixes the prompt.
//
//   request   "DSKVREQ1" u32 wire_version, str model_id, u32 layout_version, u64 fingerprint,
//             u64 expected_incarnation (0: any), u32 flags (1: the puller can GET with UCX),
//             u64 n, n × i32 prompt tokens
//   response  "DSKVRSP1" u32 wire_version, u32 status, u64 incarnation, str message; when status
//             is kOk: u64 n_tokens, u64 blob_bytes, 32 hex checksum (XXH3-128 over tokens ‖ blob),
//             u8 mode, then the tokens; then
//               mode 0 (TCP): the blob in 1 MiB writes
//               mode 1 (UCX): str descriptor; the puller GETs the blob and answers one byte:
//                 'K' done (the owner unmaps), or 'T' the GET failed: the owner sends the blob
//                 as in mode 0, once. The owner holds the mapping (the lease) at most its I/O
//                 timeout waiting for that byte.
//   (str = u32 length + bytes; integers little-endian)
//
// The puller checks every field, the total length and the checksum, and that the tokens are a
// proper prefix of its prompt; anything else is a failure with a reason, and it recomputes. A
// partial state is never returned. The sender holds a shared_ptr to the entry for the whole
// transfer: that is the pin that keeps an eviction from truncating it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "cluster/conversation_store.h"
#include "cluster/ucx_rma.h"

namespace dsuf::cluster {

inline constexpr uint32_t kWireVersion = 2;

struct TransferIdentity {
  std::string model_id;
  uint32_t layout_version = 0;
  uint64_t fingerprint = 0;
  uint64_t incarnation = 0;
};

enum class TransferStatus : uint32_t {
  kOk = 0,
  kBusy = 1,
  kNotFound = 2,
  kSkew = 3,
  kIncarnation = 4
};

struct TransferServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int max_concurrent = 4;  // outbound transfers at once; beyond it: kBusy, the puller recomputes
  int io_timeout_ms = 10000;
  // Offer UCX RMA GET to pullers that can do it (when UCX starts; else TCP only).
  bool ucx = false;
  // Fault injection for tests (DSUF_TRANSFER_FAULT): "stall" (sleep 60 s after half the blob),
  // "close" (close after half), "corrupt" (flip one blob byte), "hold" (sleep 2 s before sending),
  // "ucx_bad" (a descriptor the puller must refuse, so it falls back to TCP). "stall" and "close"
  // always take the TCP path.
  std::string fault;
};

class TransferServer {
 public:
  using Finder = std::function<ConversationPtr(std::span<const int32_t> prompt)>;
  TransferServer(TransferIdentity id, TransferServerOptions options, Finder find);
  ~TransferServer();  // stops accepting, ends open transfers, joins
  TransferServer(const TransferServer&) = delete;
  TransferServer& operator=(const TransferServer&) = delete;

  uint16_t port() const { return port_; }
  bool ucx() const { return ucx_ != nullptr; }
  struct Counters {
    uint64_t served = 0, refused_busy = 0, refused_other = 0, failed = 0, bytes = 0;
  };
  Counters counters() const;
  int active() const { return active_.load(); }

 private:
  void accept_loop();
  void serve(int fd);

  TransferIdentity id_;
  TransferServerOptions opt_;
  Finder find_;
  std::unique_ptr<UcxExporter> ucx_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};
  mutable std::mutex mu_;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers_;  // guarded by mu_
  std::condition_variable stop_cv_;
  std::list<int> open_fds_;  // guarded by mu_
  Counters c_;               // guarded by mu_
  std::thread acceptor_;
};

struct FetchResult {
  ConversationPtr conv;  // set only on success
  std::string reason;    // empty on success: connect | timeout | closed | busy | not_found |
                         // version_skew | incarnation | checksum | mismatch | protocol
  std::string detail;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string path = "tcp";  // how the state's bytes came: ucx | tcp
  // Why that path: rdma_get | ucx_failed (GET failed, TCP once) | owner_tcp_only | puller_tcp_only
  std::string path_reason;
};

// Pulls the longest state `addr` holds that prefixes `prompt`. Never throws.
// `ucx`: this puller's UCX end, or null for TCP only.
FetchResult fetch_conversation(const std::string& addr, const TransferIdentity& mine,
                               uint64_t expected_incarnation, std::span<const int32_t> prompt,
                               int timeout_ms, uint64_t max_bytes, UcxImporter* ucx = nullptr);

}  // namespace dsuf::cluster

// The RMA path of a transfer: the owner maps a stored state's bytes with UCX and hands the puller
// a descriptor (worker address, remote address, length, packed rkey) over the TCP control
// connection; the puller reads the bytes with one ucp_get_nbx. On InfiniBand/RoCE that GET is
// RDMA and the owner's CPU never touches the bytes; with UCX_TLS=tcp (tests, machines without a
// NIC) UCX emulates it over TCP, which needs the owner's worker to progress: a thread does that.
//
// Built only where UCX is (libucx-dev); the TCP chunked path works without it. Every failure is
// a string, never an abort: a stale or corrupt rkey is length-checked before ucp_ep_rkey_unpack.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dsuf::cluster {

class UcxExporter {
 public:
  UcxExporter();  // throws dsuf::Error when UCX cannot start (then the TCP path is used)
  ~UcxExporter();
  UcxExporter(const UcxExporter&) = delete;
  UcxExporter& operator=(const UcxExporter&) = delete;

  // A mapping that lives as long as the returned object (the lease on the pinned bytes).
  struct Export {
    std::string descriptor;  // what the puller needs, opaque to the TCP layer
    std::shared_ptr<void> mapping;
  };
  Export expose(const void* data, size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class UcxImporter {
 public:
  UcxImporter();  // throws dsuf::Error when UCX cannot start
  ~UcxImporter();
  UcxImporter(const UcxImporter&) = delete;
  UcxImporter& operator=(const UcxImporter&) = delete;

  // Reads the exported bytes into `out` (resized to the exported length, at most max_bytes).
  // Returns "" on success, else why not.
  std::string get(const std::string& descriptor, std::string& out, int timeout_ms,
                  uint64_t max_bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsuf::cluster

#include "cluster/transfer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/error.h"

namespace dsuf::cluster {
namespace {

constexpr char kReqMagic[8] = {'D', 'S', 'K', 'V', 'R', 'E', 'Q', '1'};
constexpr char kRspMagic[8] = {'D', 'S', 'K', 'V', 'R', 'S', 'P', '1'};
constexpr size_t kChunk = 1 << 20;

// A failure with a metric-friendly reason.
struct WireError : std::runtime_error {
  std::string reason;
  WireError(std::string r, const std::string& what)
      : std::runtime_error(what), reason(std::move(r)) {}
};

void set_timeouts(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) throw WireError("timeout", "send timed out");
      throw WireError("closed", std::string("send: ") + std::strerror(errno));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw WireError("closed", "the peer closed the connection mid-message");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) throw WireError("timeout", "receive timed out");
      throw WireError("closed", std::string("recv: ") + std::strerror(errno));
    }
    c += r;
    n -= static_cast<size_t>(r);
  }
}

class Out {
 public:
  template <class T>
  void put(T v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(std::string_view v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    s_.append(v);
  }
  void raw(const void* p, size_t n) { s_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return s_; }

 private:
  std::string s_;
};

template <class T>
T get(int fd) {
  T v;
  read_all(fd, &v, sizeof v);
  return v;
}

std::string get_str(int fd, size_t max) {
  const uint32_t n = get<uint32_t>(fd);
  if (n > max)
    throw WireError("protocol", detail::concat("a string of ", n, " bytes (limit ", max, ")"));
  std::string s(n, '\0');
  read_all(fd, s.data(), n);
  return s;
}

void respond_refusal(int fd, uint64_t inc, TransferStatus st, const std::string& msg) {
  Out o;
  o.raw(kRspMagic, 8);
  o.put<uint32_t>(kWireVersion);
  o.put<uint32_t>(static_cast<uint32_t>(st));
  o.put<uint64_t>(inc);
  o.str(msg);
  write_all(fd, o.bytes().data(), o.bytes().size());
}

}  // namespace

TransferServer::TransferServer(TransferIdentity id, TransferServerOptions options, Finder find)
    : id_(std::move(id)), opt_(std::move(options)), find_(std::move(find)) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string port = std::to_string(opt_.port);
  if (int e = getaddrinfo(opt_.host.c_str(), port.c_str(), &hints, &res); e != 0)
    fail("transfer server: cannot resolve ", opt_.host, ": ", gai_strerror(e));
  listen_fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, res->ai_addr, res->ai_addrlen) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    const int e = errno;
    freeaddrinfo(res);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    fail("transfer server: cannot listen on ", opt_.host, ":", opt_.port, ": ", std::strerror(e));
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  if (opt_.ucx) {
    try {
      ucx_ = std::make_unique<UcxExporter>();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cluster: UCX unavailable (%s); transfers use TCP\n", e.what());
    }
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

TransferServer::~TransferServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::list<Worker> workers;
  {
    std::lock_guard lk(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  stop_cv_.notify_all();
  for (auto& w : workers) w.thread.join();
}

TransferServer::Counters TransferServer::counters() const {
  std::lock_guard lk(mu_);
  return c_;
}

void TransferServer::accept_loop() {
  while (!stop_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stop_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::lock_guard lk(mu_);
    if (stop_) {
      ::close(fd);
      return;
    }
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (!it->done->load()) {
        ++it;
        continue;
      }
      it->thread.join();
      it = workers_.erase(it);
    }
    open_fds_.push_back(fd);
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back({std::thread([this, fd, done] {
                          serve(fd);
                          done->store(true);
                        }),
                        done});
  }
}

void TransferServer::serve(int fd) {
  set_timeouts(fd, opt_.io_timeout_ms);
  const bool counted = active_.fetch_add(1) < opt_.max_concurrent;
  auto bump = [&](uint64_t Counters::*f, uint64_t n = 1) {
    std::lock_guard lk(mu_);
    c_.*f += n;
  };
  try {
    char magic[8];
    read_all(fd, magic, 8);
    if (std::memcmp(magic, kReqMagic, 8) != 0) throw WireError("protocol", "bad request magic");
    const uint32_t wire = get<uint32_t>(fd);
    const std::string model = get_str(fd, 4096);
    const uint32_t layout_version = get<uint32_t>(fd);
    const uint64_t fingerprint = get<uint64_t>(fd);
    const uint64_t expect_inc = get<uint64_t>(fd);
    const uint32_t flags = get<uint32_t>(fd);
    const uint64_t n = get<uint64_t>(fd);
    if (n > (uint64_t{1} << 26)) throw WireError("protocol", "prompt too long");
    std::vector<int32_t> prompt(n);
    read_all(fd, prompt.data(), n * sizeof(int32_t));
    if (wire != kWireVersion || model != id_.model_id || layout_version != id_.layout_version ||
        fingerprint != id_.fingerprint) {
      bump(&Counters::refused_other);
      respond_refusal(
          fd, id_.incarnation, TransferStatus::kSkew,
          detail::concat("this owner runs wire ", kWireVersion, ", model ", id_.model_id,
                         ", layout v", id_.layout_version, "/", id_.fingerprint));
    } else if (expect_inc != 0 && expect_inc != id_.incarnation) {
      bump(&Counters::refused_other);
      respond_refusal(fd, id_.incarnation, TransferStatus::kIncarnation,
                      "this replica restarted since the record was written");
    } else if (!counted) {
      bump(&Counters::refused_busy);
      respond_refusal(fd, id_.incarnation, TransferStatus::kBusy,
                      detail::concat("already sending ", opt_.max_concurrent, " states"));
    } else if (ConversationPtr c = find_(prompt); !c) {
      bump(&Counters::refused_other);
      respond_refusal(fd, id_.incarnation, TransferStatus::kNotFound,
                      "no stored state prefixes it");
    } else {
      if (opt_.fault == "hold") std::this_thread::sleep_for(std::chrono::seconds(2));
      std::string corrupt;
      const std::string* blob = &c->blob;
      if (opt_.fault == "corrupt" && !blob->empty()) {
        corrupt = *blob;
        corrupt[corrupt.size() / 2] ^= 0x5a;
        blob = &corrupt;
      }
      const bool tcp_fault = opt_.fault == "close" || opt_.fault == "stall";
      UcxExporter::Export ex;
      if (ucx_ && (flags & 1) && !tcp_fault) {
        try {
          ex = ucx_->expose(blob->data(), blob->size());
          if (opt_.fault == "ucx_bad") ex.descriptor.resize(ex.descriptor.size() - 1);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "cluster: %s; sending over TCP\n", e.what());
        }
      }
      const bool via_ucx = ex.mapping != nullptr;
      Out o;
      o.raw(kRspMagic, 8);
      o.put<uint32_t>(kWireVersion);
      o.put<uint32_t>(static_cast<uint32_t>(TransferStatus::kOk));
      o.put<uint64_t>(id_.incarnation);
      o.str("");
      o.put<uint64_t>(c->tokens.size());
      o.put<uint64_t>(c->blob.size());
      o.raw(c->checksum.data(), 32);
      o.put<uint8_t>(via_ucx ? 1 : 0);
      o.raw(c->tokens.data(), c->tokens.size() * sizeof(int32_t));
      if (via_ucx) o.str(ex.descriptor);
      write_all(fd, o.bytes().data(), o.bytes().size());
      bool send_bytes = !via_ucx;
      if (via_ucx) {
        // The lease: the mapping (and the entry) stay until the puller answers or the I/O
        // timeout passes, whichever is first.
        const char ack = get<char>(fd);
        if (ack == 'T')
          send_bytes = true;
        else if (ack != 'K')
          throw WireError("protocol", "bad acknowledgement");
      }
      if (send_bytes && tcp_fault) {
        write_all(fd, blob->data(), blob->size() / 2);
        if (opt_.fault == "stall") {
          std::unique_lock lk(mu_);
          stop_cv_.wait_for(lk, std::chrono::seconds(60), [&] { return stop_.load(); });
        }
        throw WireError("fault", "injected " + opt_.fault);
      }
      if (send_bytes)
        for (size_t off = 0; off < blob->size(); off += kChunk)
          write_all(fd, blob->data() + off, std::min(kChunk, blob->size() - off));
      bump(&Counters::served);
      bump(&Counters::bytes, c->tokens.size() * 4 + c->blob.size());
    }
  } catch (const std::exception&) {
    bump(&Counters::failed);
  }
  active_.fetch_sub(1);
  std::lock_guard lk(mu_);
  ::close(fd);
  std::erase(open_fds_, fd);
}

FetchResult fetch_conversation(const std::string& addr, const TransferIdentity& mine,
                               uint64_t expected_incarnation, std::span<const int32_t> prompt,
                               int timeout_ms, uint64_t max_bytes, UcxImporter* ucx) {
  FetchResult out;
  const auto t0 = std::chrono::steady_clock::now();
  int fd = -1;
  try {
    const auto colon = addr.rfind(':');
    if (colon == std::string::npos)
      throw WireError("connect", "address '" + addr + "' has no port");
    std::string host = addr.substr(0, colon);
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), addr.c_str() + colon + 1, &hints, &res) != 0 || !res)
      throw WireError("connect", "cannot resolve " + addr);
    fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno != EINPROGRESS)
      throw WireError("connect", "connect " + addr + ": " + std::strerror(errno));
    if (rc != 0) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) != 1)
        throw WireError("connect", "connect " + addr + " timed out");
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) throw WireError("connect", "connect " + addr + ": " + std::strerror(err));
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    set_timeouts(fd, timeout_ms);

    Out o;
    o.raw(kReqMagic, 8);
    o.put<uint32_t>(kWireVersion);
    o.str(mine.model_id);
    o.put<uint32_t>(mine.layout_version);
    o.put<uint64_t>(mine.fingerprint);
    o.put<uint64_t>(expected_incarnation);
    o.put<uint32_t>(ucx ? 1u : 0u);
    o.put<uint64_t>(prompt.size());
    o.raw(prompt.data(), prompt.size() * sizeof(int32_t));
    write_all(fd, o.bytes().data(), o.bytes().size());

    char magic[8];
    read_all(fd, magic, 8);
    if (std::memcmp(magic, kRspMagic, 8) != 0) throw WireError("protocol", "bad response magic");
    const uint32_t wire = get<uint32_t>(fd);
    if (wire != kWireVersion)
      throw WireError("version_skew",
                      detail::concat("the owner speaks wire ", wire, ", we ", kWireVersion));
    const auto status = static_cast<TransferStatus>(get<uint32_t>(fd));
    const uint64_t inc = get<uint64_t>(fd);
    const std::string msg = get_str(fd, 4096);
    switch (status) {
      case TransferStatus::kOk:
        break;
      case TransferStatus::kBusy:
        throw WireError("busy", msg);
      case TransferStatus::kNotFound:
        throw WireError("not_found", msg);
      case TransferStatus::kSkew:
        throw WireError("version_skew", msg);
      case TransferStatus::kIncarnation:
        throw WireError("incarnation", msg);
      default:
        throw WireError("protocol",
                        detail::concat("unknown status ", static_cast<uint32_t>(status)));
    }
    if (expected_incarnation != 0 && inc != expected_incarnation)
      throw WireError("incarnation", "the owner answered with another incarnation");
    const uint64_t n = get<uint64_t>(fd);
    const uint64_t blob_bytes = get<uint64_t>(fd);
    std::string sum(32, '\0');
    read_all(fd, sum.data(), 32);
    const uint8_t mode = get<uint8_t>(fd);
    if (n == 0 || n >= prompt.size())
      throw WireError("mismatch", detail::concat("the owner offers ", n, " tokens for a prompt of ",
                                                 prompt.size()));
    if (blob_bytes > max_bytes)
      throw WireError("protocol",
                      detail::concat("a state of ", blob_bytes, " bytes (limit ", max_bytes, ")"));
    if (mode > 1 || (mode == 1 && !ucx)) throw WireError("protocol", "an unknown transfer mode");
    std::vector<int32_t> tokens(n);
    read_all(fd, tokens.data(), n * sizeof(int32_t));
    std::string blob;
    bool over_tcp = mode == 0;
    out.path_reason = mode == 1 ? "rdma_get" : ucx ? "owner_tcp_only" : "puller_tcp_only";
    if (mode == 1) {
      const std::string desc = get_str(fd, 1 << 20);
      const std::string err = ucx->get(desc, blob, timeout_ms, max_bytes);
      if (err.empty() && blob.size() == blob_bytes) {
        out.path = "ucx";
        const char k = 'K';
        write_all(fd, &k, 1);
      } else {
        // Fall back to the chunked path exactly once; no retry of the GET.
        std::fprintf(stderr, "cluster: UCX GET from %s failed (%s); pulling over TCP\n",
                     addr.c_str(), err.empty() ? "length" : err.c_str());
        out.path_reason = "ucx_failed";
        const char t = 'T';
        write_all(fd, &t, 1);
        over_tcp = true;
      }
    }
    if (over_tcp) {
      blob.assign(blob_bytes, '\0');
      for (uint64_t off = 0; off < blob_bytes; off += kChunk)
        read_all(fd, blob.data() + off, std::min<uint64_t>(kChunk, blob_bytes - off));
    }
    out.bytes = n * 4 + blob_bytes;
    auto c = StoredConversation::make(std::move(tokens), std::move(blob));
    if (c->checksum != sum) throw WireError("checksum", "the state's checksum does not match");
    if (!c->is_prefix_of(prompt))
      throw WireError("mismatch", "the owner's tokens are not a prefix of the prompt");
    out.conv = std::move(c);
  } catch (const WireError& e) {
    out.reason = e.reason;
    out.detail = e.what();
    out.conv.reset();
  } catch (const std::exception& e) {
    out.reason = "protocol";
    out.detail = e.what();
    out.conv.reset();
  }
  if (fd >= 0) ::close(fd);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace dsuf::cluster

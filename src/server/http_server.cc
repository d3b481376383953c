// The only translation unit that includes Beast. Every connection is a coroutine on one I/O
// thread; the engine's scheduler thread hands token events over with asio::post, so all
// per-request state below is touched by the I/O thread alone.
#include "server/http_server.h"

#include <pthread.h>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <random>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/error.h"

namespace dsuf::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;
constexpr auto kTuple = asio::as_tuple(use_awaitable);

std::chrono::steady_clock::duration secs(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Events from the scheduler thread, queued for the connection's coroutine.
struct Pending {
  explicit Pending(asio::any_io_executor ex) : wake(ex) {}
  std::deque<TokenEvent> events;
  asio::steady_timer wake;  // cancelled to wake the coroutine
  bool gone = false;        // the client went away
  bool watching = false;    // the disconnect watcher is running
};

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = hex[rng() & 15];
  return s;
}

// Built outside the coroutines: g++ 12 rejects aggregate temporaries with string members inside
// co_await expressions ("array used as initializer").
ApiError not_found(const std::string& path) {
  return {.status = 404, .code = "not_found", .message = "no route for " + path};
}
ApiError model_not_found(const std::string& id) {
  return {.status = 404,
          .code = "model_not_found",
          .param = "model",
          .message = "the model '" + id + "' does not exist"};
}
ApiError shutting_down() {
  return {.status = 503,
          .type = "server_error",
          .code = "unavailable",
          .message = "the server is shutting down",
          .retry_after_s = 5};
}
ApiError request_timeout(double s) {
  return {.status = 408,
          .code = "request_timeout",
          .message = detail::concat("the request did not arrive completely within ", s, " s")};
}
ApiError too_large(size_t limit) {
  return {.status = 413,
          .code = "request_too_large",
          .message = detail::concat("the request body exceeds the limit of ", limit, " bytes")};
}
ApiError headers_too_large() {
  return {
      .status = 431, .code = "headers_too_large", .message = "the request headers exceed 64 KiB"};
}
ApiError internal_error(const std::string& what) {
  return {.status = 500, .type = "server_error", .code = "internal_error", .message = what};
}
std::string status_body(const std::string& why) {
  return dump(Json{{"status", why}});
}
ApiError malformed(const std::string& what) {
  return bad_request("malformed HTTP request: " + what);
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions opt;
  Metrics& metrics;
  asio::io_context ioc{1};
  asio::thread_pool prep_pool{1};  // request parsing and prompt rendering, off the I/O thread
  // Conversation-cache lookups: a pull from a peer can take up to its timeout, so it gets threads
  // of its own rather than holding up parsing.
  asio::thread_pool cache_pool{4};
  tcp::acceptor acceptor{ioc};
  asio::signal_set signals{ioc, SIGTERM, SIGINT};
  std::mutex mu;
  std::shared_ptr<ChatService> service;  // guarded by mu
  std::string load_error;                // guarded by mu
  bool draining = false;                 // I/O thread
  int inflight = 0;                      // chat requests being answered (I/O thread)

  Impl(ServerOptions o, Metrics& m) : opt(std::move(o)), metrics(m) {}

  std::shared_ptr<ChatService> svc() {
    std::lock_guard lk(mu);
    return service;
  }

  // ---- writing -----------------------------------------------------------------------------
  template <class Body>
  awaitable<bool> write(tcp::socket& sock, http::response<Body>& res) {
    asio::steady_timer t(sock.get_executor());
    t.expires_after(secs(opt.write_timeout_s));
    t.async_wait([&sock](boost::system::error_code ec) {
      if (!ec) sock.cancel();
    });
    res.prepare_payload();
    auto [ec, n] = co_await http::async_write(sock, res, kTuple);
    t.cancel();
    co_return !ec;
  }

  awaitable<bool> send(tcp::socket& sock, unsigned version, bool keep_alive, http::status status,
                       std::string body, std::string_view content_type = "application/json",
                       int retry_after = 0) {
    http::response<http::string_body> res{status, version};
    res.set(http::field::server, "dsuf");
    res.set(http::field::content_type, content_type);
    if (retry_after > 0) res.set(http::field::retry_after, std::to_string(retry_after));
    res.keep_alive(keep_alive);
    res.body() = std::move(body);
    metrics.http(static_cast<int>(status));
    co_return co_await write(sock, res);
  }

  awaitable<bool> send_error(tcp::socket& sock, unsigned version, bool keep_alive,
                             const ApiError& e) {
    co_return co_await send(sock, version, keep_alive, static_cast<http::status>(e.status),
                            error_body(e), "application/json", e.retry_after_s);
  }

  awaitable<bool> write_chunk(tcp::socket& sock, const std::string& data) {
    asio::steady_timer t(sock.get_executor());
    t.expires_after(secs(opt.write_timeout_s));
    t.async_wait([&sock](boost::system::error_code ec) {
      if (!ec) sock.cancel();
    });
    auto [ec, n] = co_await asio::async_write(sock, http::make_chunk(asio::buffer(data)), kTuple);
    t.cancel();
    co_return !ec;
  }

  struct Prepared {
    PreparedChat chat;
    std::optional<ApiError> error;
  };
  static awaitable<Prepared> prepare(std::shared_ptr<ChatService> s, std::string body) {
    Prepared r;
    try {
      r.chat = s->prepare(body);
    } catch (const ApiError& e) {
      r.error = e;
    } catch (const std::exception& e) {
      r.error = internal_error(e.what());
    }
    co_return r;
  }

  // ---- the disconnect watcher --------------------------------------------------------------
  // Keeps a read pending while a chat is answered, so a client that closes is noticed at once
  // (not at the next write). Bytes that do arrive (a pipelined request) stay in `buf`.
  awaitable<void> watch(tcp::socket& sock, beast::flat_buffer& buf, std::shared_ptr<Pending> st) {
    st->watching = true;
    auto [ec, n] = co_await sock.async_read_some(buf.prepare(4096), kTuple);
    buf.commit(n);
    if (ec && ec != asio::error::operation_aborted) st->gone = true;
    st->watching = false;
    st->wake.cancel();
  }

  // ---- routes ------------------------------------------------------------------------------
  awaitable<bool> handle(tcp::socket& sock, beast::flat_buffer& buf,
                         http::request<http::string_body>& req) {
    std::string_view target(req.target().data(), req.target().size());
    const std::string path(target.substr(0, target.find('?')));
    const unsigned v = req.version();
    const bool ka = req.keep_alive();
    const bool get = req.method() == http::verb::get;
    const bool post = req.method() == http::verb::post;

    if (path == "/livez") {
      if (!get)
        co_return co_await send_error(sock, v, ka, method_not_allowed(path, std::string("GET")));
      co_return co_await send(sock, v, ka, http::status::ok, std::string(R"({"status":"ok"})"));
    }
    if (path == "/readyz" || path == "/health") {
      if (!get)
        co_return co_await send_error(sock, v, ka, method_not_allowed(path, std::string("GET")));
      std::string why;
      {
        std::lock_guard lk(mu);
        why = !load_error.empty() ? "failed: " + load_error : !service ? "loading" : "";
      }
      if (why.empty() && draining) why = "draining";
      if (why.empty() && !svc()->engine().ready()) why = "warming up";
      if (!why.empty())
        co_return co_await send(sock, v, ka, http::status::service_unavailable, status_body(why),
                                std::string_view("application/json"), 5);
      co_return co_await send(sock, v, ka, http::status::ok, std::string(R"({"status":"ok"})"));
    }
    if (path == "/metrics") {
      if (!get)
        co_return co_await send_error(sock, v, ka, method_not_allowed(path, std::string("GET")));
      auto s = svc();
      EngineStats st;
      if (s) st = s->engine().stats();
      co_return co_await send(sock, v, ka, http::status::ok, metrics.render(st),
                              std::string_view("text/plain; version=0.0.4"));
    }
    if (path == "/v1/models" || path == "/models" || path.starts_with("/v1/models/")) {
      if (!get)
        co_return co_await send_error(sock, v, ka, method_not_allowed(path, std::string("GET")));
      auto s = svc();
      if (!s) co_return co_await send_error(sock, v, ka, loading());
      if (path.starts_with("/v1/models/")) {
        const std::string id = path.substr(11);
        if (id != s->model().id) co_return co_await send_error(sock, v, ka, model_not_found(id));
        co_return co_await send(sock, v, ka, http::status::ok, model_body(s->model()));
      }
      co_return co_await send(sock, v, ka, http::status::ok, models_body(s->model()));
    }
    if (path == "/v1/chat/completions" || path == "/chat/completions") {
      if (!post)
        co_return co_await send_error(sock, v, ka, method_not_allowed(path, std::string("POST")));
      co_return co_await chat(sock, buf, req);
    }
    co_return co_await send_error(sock, v, ka, not_found(path));
  }

  static ApiError method_not_allowed(const std::string& path, const std::string& allowed) {
    return {.status = 405,
            .code = "method_not_allowed",
            .message = path + " accepts " + allowed + " only"};
  }
  ApiError loading() {
    std::lock_guard lk(mu);
    return {.status = 503,
            .type = "server_error",
            .code = "unavailable",
            .message = load_error.empty() ? "the model is still loading"
                                          : "the model failed to load: " + load_error,
            .retry_after_s = 5};
  }

  awaitable<bool> chat(tcp::socket& sock, beast::flat_buffer& buf,
                       http::request<http::string_body>& req) {
    const auto t0 = Clock::now();
    const unsigned v = req.version();
    const bool ka = req.keep_alive();
    auto s = svc();
    if (!s || !s->engine().ready()) co_return co_await send_error(sock, v, ka, loading());
    if (draining) co_return co_await send_error(sock, v, ka, shutting_down());
    const std::string id = "chatcmpl-" + random_hex(24);
    std::string peer;
    {
      boost::system::error_code ec;
      auto ep = sock.remote_endpoint(ec);
      if (!ec) peer = ep.address().to_string() + ":" + std::to_string(ep.port());
    }
    auto log_refusal = [&](const ApiError& e) {
      std::fprintf(stderr, "chat %s %s status=%d error=\"%s\"\n", id.c_str(), peer.c_str(),
                   e.status, e.message.substr(0, 200).c_str());
    };
    // Parsing, rendering and tokenizing a long conversation takes a while (a megabyte prompt is
    // tens of milliseconds); done here it would stall every stream's writes, so it runs on the
    // preparation thread while this coroutine waits.
    Prepared prep =
        co_await asio::co_spawn(prep_pool, prepare(s, std::move(req.body())), use_awaitable);
    PreparedChat& p = prep.chat;
    std::optional<ApiError>& refused = prep.error;
    if (refused) {
      log_refusal(*refused);
      co_return co_await send_error(sock, v, ka, *refused);
    }
    p.session = session_id(req["x-deepseek-harness-session-id"], req["x-session-id"]);
    if (s->has_cache())
      co_await asio::co_spawn(
          cache_pool,
          [&]() -> awaitable<void> {
            s->attach_cache(p);
            co_return;
          },
          use_awaitable);
    if (!p.call.seed_given)
      p.call.sampling.seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);

    auto st = std::make_shared<Pending>(sock.get_executor());
    uint64_t rid = 0;
    try {
      rid = s->submit(p, [st, ex = sock.get_executor()](TokenEvent&& ev) {
        asio::post(ex, [st, ev = std::move(ev)]() mutable {
          st->events.push_back(std::move(ev));
          st->wake.cancel();
        });
      });
    } catch (const ApiError& e) {
      refused = e;
    }
    if (refused) {
      log_refusal(*refused);
      co_return co_await send_error(sock, v, ka, *refused);
    }
    ++inflight;

    ChatStream cs(s->tokenizer(), p,
                  {.id = id, .created = std::time(nullptr), .model = p.call.model});
    const bool stream = p.call.stream;
    bool ok = true;
    if (stream) {
      http::response<http::empty_body> res{http::status::ok, v};
      res.set(http::field::server, "dsuf");
      res.set(http::field::content_type, "text/event-stream");
      res.set(http::field::cache_control, "no-cache");
      res.set("X-Accel-Buffering", "no");
      res.keep_alive(ka);
      res.chunked(true);
      http::response_serializer<http::empty_body> sr{res};
      auto [ec, n] = co_await http::async_write_header(sock, sr, kTuple);
      ok = !ec && co_await write_chunk(sock, cs.open());
      metrics.http(200);
    }
    if (ok) asio::co_spawn(sock.get_executor(), watch(sock, buf, st), asio::detached);

    Clock::time_point first{}, last{};
    while (ok) {
      while (!st->events.empty() && !cs.done()) {
        TokenEvent ev = std::move(st->events.front());
        st->events.pop_front();
        if (!ev.tokens.empty()) {
          const auto now = Clock::now();
          if (first == Clock::time_point{}) {
            first = now;
            metrics.ttft.observe(std::chrono::duration<double>(now - t0).count());
          } else {
            metrics.itl.observe(std::chrono::duration<double>(now - last).count());
          }
          last = now;
        }
        const std::string out = cs.on_event(ev);
        if (cs.wants_cancel()) s->cancel(rid);
        if (stream && !out.empty() && !(ok = co_await write_chunk(sock, out))) break;
      }
      if (!ok || cs.done() || st->gone) break;
      st->wake.expires_after(secs(opt.keepalive_s));
      auto [ec] = co_await st->wake.async_wait(kTuple);
      // A quiet stretch (long prefill, a full queue): a comment keeps proxies and dsh patient.
      if (!ec && stream && st->events.empty() && !st->gone)
        ok = co_await write_chunk(sock, ": keep-alive\n\n");
    }
    const bool gone = !ok || st->gone;
    if (gone && !cs.done()) {
      s->cancel(rid);
      ++metrics.disconnects;
    }
    // Stop the watcher before the next request on this connection reads the buffer.
    if (st->watching) {
      boost::system::error_code ec;
      sock.cancel(ec);
      while (st->watching) {
        st->wake.expires_after(std::chrono::seconds(5));
        co_await st->wake.async_wait(kTuple);
      }
    }
    --inflight;

    bool keep = ka && !gone;
    if (!gone) {
      if (stream) {
        auto [ec, n] = co_await asio::async_write(sock, http::make_chunk_last(), kTuple);
        keep = keep && !ec;
      } else if (cs.failed()) {
        keep = co_await send_error(sock, v, ka, cs.error()) && ka;
      } else {
        keep = co_await send(sock, v, ka, http::status::ok, cs.response_body()) && ka;
      }
    }
    const double e2e = since(t0);
    const std::string reason = gone && !cs.done() ? "abort" : cs.finish_reason();
    if (!gone || cs.done()) {
      metrics.e2e.observe(e2e);
      metrics.prompt_len.observe(static_cast<double>(cs.prompt_tokens()));
      metrics.generation_len.observe(static_cast<double>(cs.completion_tokens()));
    }
    metrics.finished(reason);
    std::fprintf(
        stderr, "chat %s %s %s prompt=%lld completion=%lld ttft=%.3fs e2e=%.3fs finish=%s%s\n",
        id.c_str(), peer.c_str(), stream ? "stream" : "json",
        static_cast<long long>(cs.prompt_tokens()), static_cast<long long>(cs.completion_tokens()),
        first == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(first - t0).count(), e2e,
        reason.c_str(), gone && !cs.done() ? " (client gone)" : "");
    co_return keep;
  }

  // ---- connections -------------------------------------------------------------------------
  awaitable<void> session(tcp::socket sock) {
    boost::system::error_code ig;
    sock.set_option(tcp::no_delay(true), ig);
    beast::flat_buffer buf;
    asio::steady_timer timer(sock.get_executor());
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(opt.max_body_bytes);
      parser.header_limit(64 * 1024);
      // An idle keep-alive connection may wait long for its next request; once the first byte is
      // there, the whole request must arrive within the request timeout, so a sender that trickles
      // bytes cannot hold a connection forever.
      if (buf.size() == 0) {
        timer.expires_after(secs(opt.idle_timeout_s));
        timer.async_wait([&sock](boost::system::error_code ec) {
          if (!ec) sock.cancel();
        });
        auto [ec] = co_await sock.async_wait(tcp::socket::wait_read, kTuple);
        timer.cancel();
        if (ec) break;
      }
      bool timed_out = false;
      timer.expires_after(secs(opt.request_timeout_s));
      timer.async_wait([&](boost::system::error_code ec) {
        if (ec) return;
        timed_out = true;
        sock.cancel();
      });
      auto [ec, n] = co_await http::async_read_header(sock, buf, parser, kTuple);
      // curl sends "Expect: 100-continue" for bodies over 1 KiB and waits a second for the
      // go-ahead.
      if (!ec && !parser.is_done() &&
          beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        auto [e2, n2] = co_await asio::async_write(sock, asio::buffer(kContinue), kTuple);
        ec = e2;
      }
      if (!ec && !parser.is_done()) {
        auto [e3, n3] = co_await http::async_read(sock, buf, parser, kTuple);
        ec = e3;
      }
      timer.cancel();
      if (ec) {
        const unsigned ver = parser.get().version() ? parser.get().version() : 11;
        if (timed_out) {
          if (parser.got_some() || buf.size())
            co_await send_error(sock, ver, false, request_timeout(opt.request_timeout_s));
        } else if (ec == http::error::body_limit) {
          co_await send_error(sock, ver, false, too_large(opt.max_body_bytes));
        } else if (ec == http::error::header_limit) {
          co_await send_error(sock, ver, false, headers_too_large());
        } else if (ec.category() == http::make_error_code(http::error::bad_version).category() &&
                   ec != http::error::end_of_stream && ec != http::error::partial_message) {
          co_await send_error(sock, ver, false, malformed(ec.message()));
        }
        break;
      }
      auto req = parser.release();
      if (!co_await handle(sock, buf, req)) break;
      if (!req.keep_alive()) break;
    }
    sock.shutdown(tcp::socket::shutdown_send, ig);
    sock.close(ig);
  }

  awaitable<void> accept_loop() {
    for (;;) {
      auto [ec, sock] = co_await acceptor.async_accept(kTuple);
      if (!acceptor.is_open()) co_return;
      if (ec) {
        // Out of descriptors and the like: back off instead of spinning.
        asio::steady_timer t(ioc);
        t.expires_after(std::chrono::milliseconds(50));
        co_await t.async_wait(kTuple);
        continue;
      }
      asio::co_spawn(ioc, session(std::move(sock)), asio::detached);
    }
  }

  awaitable<void> drain() {
    draining = true;
    auto s = svc();
    if (s) s->engine().stop_accepting();
    std::fprintf(stderr, "serve: draining %d in-flight request(s) (up to %.0f s)\n", inflight,
                 opt.drain_timeout_s);
    asio::steady_timer t(ioc);
    const auto deadline = Clock::now() + secs(opt.drain_timeout_s);
    while (inflight > 0 && Clock::now() < deadline) {
      t.expires_after(std::chrono::milliseconds(50));
      co_await t.async_wait(kTuple);
    }
    if (inflight > 0 && s) {
      std::fprintf(stderr, "serve: ending %d request(s) with an error\n", inflight);
      s->engine().abort_all("the server is shutting down");
      const auto hard = Clock::now() + std::chrono::seconds(10);
      while (inflight > 0 && Clock::now() < hard) {
        t.expires_after(std::chrono::milliseconds(20));
        co_await t.async_wait(kTuple);
      }
    }
    boost::system::error_code ig;
    acceptor.close(ig);
    ioc.stop();
  }
};

HttpServer::HttpServer(ServerOptions options, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), metrics)) {
  // Named, so profilers and bench/serve_bench.py can tell it from the scheduler thread.
  asio::post(impl_->prep_pool, [] { pthread_setname_np(pthread_self(), "dsuf-prepare"); });
}
HttpServer::~HttpServer() = default;

uint16_t HttpServer::listen() {
  auto& a = impl_->acceptor;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(impl_->opt.host, ec);
  if (ec) fail("--host ", impl_->opt.host, ": not an IP address (", ec.message(), ")");
  tcp::endpoint ep(addr, impl_->opt.port);
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", impl_->opt.host, ":", impl_->opt.port, ": ", ec.message());
  return a.local_endpoint().port();
}

void HttpServer::set_service(std::shared_ptr<ChatService> service) {
  std::lock_guard lk(impl_->mu);
  impl_->service = std::move(service);
}

void HttpServer::set_load_error(std::string message) {
  std::lock_guard lk(impl_->mu);
  impl_->load_error = std::move(message);
}

void HttpServer::run() {
  Impl& m = *impl_;
  m.signals.async_wait([&m](boost::system::error_code ec, int) {
    if (ec) return;
    asio::co_spawn(m.ioc, m.drain(), asio::detached);
    // A second signal ends the drain window at once.
    m.signals.async_wait([&m](boost::system::error_code ec2, int) {
      if (ec2) return;
      if (auto s = m.svc()) s->engine().abort_all("the server is shutting down");
    });
  });
  asio::co_spawn(m.ioc, m.accept_loop(), asio::detached);
  m.ioc.run();
}

void HttpServer::stop() {
  asio::post(impl_->ioc, [this] { impl_->ioc.stop(); });
}

}  // namespace dsuf::server

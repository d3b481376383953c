// The HTTP/1.1 front end on Boost.Beast: asynchronous, one I/O thread, so thousands of idle SSE
// streams cost no threads. Beast lives only in http_server.cc (it is slow to compile). Until a
// ChatService is attached (weights loaded, warm-up done) chat requests and /readyz answer 503.
//
// SIGTERM/SIGINT: /readyz turns 503 at once and new chats are refused with 503; in-flight requests
// get up to drain_timeout_s to finish, then end with an error event and [DONE]; then run() returns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/chat_service.h"
#include "server/metrics.h"

namespace dsuf::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 8000;
  size_t max_body_bytes = 16u << 20;
  double request_timeout_s = 30;  // headers and body must arrive within this (slow senders: 408)
  double idle_timeout_s = 120;    // a keep-alive connection with no new request is closed
  double keepalive_s = 10;        // SSE comment interval while nothing else is sent
  double write_timeout_s = 60;    // a client that stops reading is treated as gone
  double drain_timeout_s = 30;    // after SIGTERM, before in-flight streams are ended
};

class HttpServer {
 public:
  HttpServer(ServerOptions options, Metrics& metrics);
  ~HttpServer();

  // Binds and listens; returns the port (useful with port 0). Throws dsuf::Error naming host:port.
  uint16_t listen();
  // Thread-safe: attach the chat service once the model is ready, or the reason it never will be.
  void set_service(std::shared_ptr<ChatService> service);
  void set_load_error(std::string message);
  // Serves until a signal's drain completes (or stop()); installs the SIGTERM/SIGINT handlers.
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsuf::server

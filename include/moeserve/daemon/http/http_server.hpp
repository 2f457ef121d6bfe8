// The daemon's HTTP/1.1 front (Boost.Beast over Asio, optionally TLS).
//
// Why not cpprestsdk's http_listener: it reads a whole request body before any
// handler runs and answers nothing (not even 401 or 413) until the body is
// complete, so an endless chunked POST grows the process without bound. Here
// every byte a client can make the daemon hold is bounded before it is read:
//   - the head (request line + headers) by `max_header_bytes`, and it must
//     arrive within `header_timeout_seconds` of the connection being ready for
//     it (slow-header clients are cut off);
//   - the body by what `admit` allows after seeing the head: a request refused
//     there (no key, unknown route, draining) is answered without reading its
//     body, and a body past its limit, chunked or not, is answered 413 after at
//     most the limit plus one read buffer;
//   - a streamed answer by `max_stream_buffer_bytes` of unsent data: a client
//     that stops reading is cut off and its request told (OnClientGone);
//   - connections by `max_connections` (more are closed at accept).
// A client that hangs up while its request runs is noticed at once (the
// connection keeps a read pending), so the request can stop its work.
//
// TLS: with a certificate and key file, every connection is TLS. The files
// are checked for changes (inode, size, mtime) at most once per
// `tls_reload_check_seconds` on accept; new connections then use the new
// pair, and a pair that does not load keeps the old one (logged).
//
// Thread safety: Start once; Stop from the owning thread. `admit` and
// `handle` run on the server's threads, concurrently for different
// connections and in order for one connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see HttpServer::port())
  int threads = 4;
  size_t max_header_bytes = 16 << 10;
  double header_timeout_seconds = 15;  // also the keep-alive idle limit
  double body_timeout_seconds = 60;
  double write_timeout_seconds = 60;   // an answer that makes no progress for this long is cut off
  size_t max_connections = 16384;
  size_t max_stream_buffer_bytes = 1 << 20;
  std::string tls_cert_file;  // both set: TLS
  std::string tls_key_file;
  double tls_reload_check_seconds = 1;
};

// What to do with a request once its head is known.
struct HttpAdmission {
  std::optional<HttpResponse> refusal;  // set: answer this and do not read the body
  size_t body_limit = 0;                // otherwise: the most body bytes to read
  static HttpAdmission Accept(size_t body_limit) { return {std::nullopt, body_limit}; }
  static HttpAdmission Refuse(HttpResponse r) { return {std::move(r), 0}; }
};

struct HttpServerHooks {
  std::function<HttpAdmission(const HttpHead&)> admit;
  std::function<void(HttpHead head, std::string body, std::shared_ptr<HttpExchange> exchange)> handle;
  // The answer to a request the server itself refuses (413, 431, 400):
  // status and a human-readable reason. Default: a plain-text body.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
};

struct HttpServerStats {
  uint64_t open_connections = 0;
  uint64_t refused_connections = 0;   // over max_connections
  uint64_t timed_out_connections = 0;  // header, body or write deadline passed
  uint64_t oversized_bodies = 0;       // answered 413 by the server
  uint64_t slow_readers_cut = 0;       // stream buffer bound passed
  uint64_t tls_reloads = 0;
};

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> Start(HttpServerOptions options, HttpServerHooks hooks);
  ~HttpServer();

  // Stops accepting, closes every connection and joins the threads. Exchanges
  // still held elsewhere become inert (their client is gone).
  void Stop();
  int port() const;
  bool tls() const;
  HttpServerStats stats() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::daemon

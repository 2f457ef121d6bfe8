// Forwarding of a session request to the replica that owns the session
// (session_service.hpp): the same method, path, query, body and
// Authorization, plus `forwarded_header`, sent with libcurl from a thread of
// its own; the answer comes back as it arrives (a stream event by event).
// An unreachable peer is 503 unavailable; a client that hangs up aborts the
// transfer, which the peer sees as a hang-up too.
//
// Bounded, because a peer that accepts and never answers would otherwise
// hold a thread per request forever: at most `max_in_flight` forwards run at
// once (one thread each; the next is refused at once with 503 and
// Retry-After rather than queued behind stalled ones), and each has an
// overall deadline, connection to last byte, after which the client gets a
// 503 naming the deadline (or, mid-stream, a stream ended without [DONE]).
//
// Thread safety: Forward may be called from any thread; the exchange is used
// from the forwarding thread. Threads still running when the forwarder is
// destroyed finish on their own (they share the in-flight count).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

class PeerForwarder {
 public:
  PeerForwarder(int max_in_flight, double deadline_seconds);

  void Forward(const std::string& base_url, const HttpHead& head, std::string body,
               std::shared_ptr<HttpExchange> exchange, const char* forwarded_header);

  int in_flight() const { return counter_->load(); }

 private:
  int max_in_flight_;
  double deadline_seconds_;
  std::shared_ptr<std::atomic<int>> counter_;
};

}  // namespace moeserve::daemon

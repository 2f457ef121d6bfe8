// Server-sent events over an HttpExchange.
//
// Events may be produced (by the scheduler thread) before the response head
// can go out: the head waits until the sequence exists, so that a refused
// request still gets a plain HTTP error. Until Begin, events are kept here;
// Begin sends the head and them, in order. After that each Send is one chunk
// on the wire; a client that stops reading is cut off by the exchange's bound
// (HttpServerOptions::max_stream_buffer_bytes) and its OnClientGone runs.
//
// Thread safety: Send, Begin and Close may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

class SseWriter {
 public:
  explicit SseWriter(std::shared_ptr<HttpExchange> exchange) : exchange_(std::move(exchange)) {}
  // Sends the 200 head with `text/event-stream` (and `extra` headers) and
  // what was sent before.
  void Begin(HttpHeaders extra = {});
  // "data: <payload>\n\n"
  void Send(const std::string& payload);
  void Close();

 private:
  std::shared_ptr<HttpExchange> exchange_;
  std::mutex mu_;
  bool begun_ = false, closed_ = false;
  std::string early_;  // events before Begin
};

}  // namespace moeserve::daemon

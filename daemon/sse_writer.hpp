// Server-sent events over a cpprestsdk response.
//
// The response body is a producer_consumer_buffer that this writer fills from
// the scheduler thread (putn_nocopy + sync per event, close at the end): the
// Debian cpprestsdk 2.10.18 then sends each event as it is written (layout.md).
//
// How a client that goes away is reported (prototyped before this was
// written): writes into the buffer keep succeeding; the only signal is the
// task returned by http_request::reply(), which fails with "error writing
// response" at the first socket write after the peer closed. Attach() turns
// that into the on_disconnect callback, which the caller uses to cancel the
// sequence, so it is freed at the next scheduler step.
//
// Thread safety: Send/Close from one thread at a time (the scheduler loop);
// the disconnect callback runs on a cpprestsdk pool thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>

namespace moeserve::daemon {

class SseWriter {
 public:
  // Sends the 200 response head with `text/event-stream` and starts streaming.
  void Attach(web::http::http_request request, std::function<void()> on_disconnect);
  // "data: <payload>\n\n"
  void Send(const std::string& payload);
  void Close();
  bool disconnected() const { return disconnected_->load(); }

 private:
  concurrency::streams::producer_consumer_buffer<uint8_t> buffer_;
  std::shared_ptr<std::atomic<bool>> disconnected_ = std::make_shared<std::atomic<bool>>(false);
  bool closed_ = false;
};

}  // namespace moeserve::daemon

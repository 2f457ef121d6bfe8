#include "sse_writer.hpp"

namespace moeserve::daemon {

void SseWriter::Attach(web::http::http_request request, std::function<void()> on_disconnect) {
  web::http::http_response response(web::http::status_codes::OK);
  response.headers().add("Cache-Control", "no-cache");
  response.headers().add("X-Accel-Buffering", "no");  // proxies must not hold events back
  response.set_body(concurrency::streams::istream(buffer_), "text/event-stream");
  auto flag = disconnected_;
  request.reply(response).then([flag, on_disconnect = std::move(on_disconnect)](pplx::task<void> sent) {
    try {
      sent.get();
    } catch (...) {
      flag->store(true);
      if (on_disconnect) on_disconnect();
    }
  });
}

void SseWriter::Send(const std::string& payload) {
  if (closed_ || disconnected_->load()) return;
  std::string event = "data: " + payload + "\n\n";
  // producer_consumer_buffer copies the bytes before the task completes.
  buffer_.putn_nocopy(reinterpret_cast<const uint8_t*>(event.data()), event.size()).wait();
  buffer_.sync().wait();
}

void SseWriter::Close() {
  if (closed_) return;
  closed_ = true;
  buffer_.close(std::ios_base::out).wait();
}

}  // namespace moeserve::daemon

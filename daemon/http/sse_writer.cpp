#include "http/sse_writer.hpp"

namespace moeserve::daemon {

void SseWriter::Begin(HttpHeaders extra) {
  std::lock_guard lock(mu_);
  if (begun_) return;
  begun_ = true;
  HttpHeaders headers = {{"Cache-Control", "no-cache"},
                         {"X-Accel-Buffering", "no"}};  // proxies must not hold events back
  for (auto& h : extra) headers.push_back(std::move(h));
  exchange_->BeginStream(200, "text/event-stream", std::move(headers));
  if (!early_.empty()) exchange_->Write(std::move(early_));
  early_.clear();
  if (closed_) exchange_->EndStream();
}

void SseWriter::Send(const std::string& payload) {
  std::lock_guard lock(mu_);
  if (closed_) return;
  std::string event = "data: " + payload + "\n\n";
  if (!begun_) {
    early_ += event;
    return;
  }
  exchange_->Write(std::move(event));
}

void SseWriter::Close() {
  std::lock_guard lock(mu_);
  if (closed_) return;
  closed_ = true;
  if (begun_) exchange_->EndStream();
}

}  // namespace moeserve::daemon

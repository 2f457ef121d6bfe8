#include "exchange_impl.hpp"

namespace moeserve::daemon {

bool ExchangeImpl::Start() {
  std::lock_guard lock(mu_);
  if (started_ || gone_) return false;
  started_ = true;
  return true;
}

void ExchangeImpl::Reply(HttpResponse response) {
  if (!Start()) return;
  if (auto c = connection_.lock()) c->PostReply(std::move(response));
}

void ExchangeImpl::BeginStream(int status, std::string content_type, HttpHeaders headers) {
  if (!Start()) return;
  {
    std::lock_guard lock(mu_);
    streaming_ = true;
  }
  if (auto c = connection_.lock()) c->PostBeginStream(status, std::move(content_type), std::move(headers));
}

HttpExchange::WriteResult ExchangeImpl::Write(std::string data) {
  {
    std::lock_guard lock(mu_);
    if (gone_) return WriteResult::kClientGone;
    if (!streaming_ || ended_) return WriteResult::kClientGone;
  }
  const size_t n = data.size();
  if (unsent_.load() + n > max_unsent_) {
    // The client has stopped reading (or reads far slower than we write):
    // holding more for it would let one reader grow the daemon.
    if (slow_cut_) slow_cut_->fetch_add(1);
    auto c = connection_.lock();
    MarkGone();
    if (c) c->PostClose();
    return WriteResult::kTooSlow;
  }
  auto c = connection_.lock();
  if (!c) return WriteResult::kClientGone;
  unsent_.fetch_add(n);
  c->PostChunk(std::move(data), n);
  return WriteResult::kQueued;
}

void ExchangeImpl::EndStream() {
  {
    std::lock_guard lock(mu_);
    if (!streaming_ || ended_ || gone_) return;
    ended_ = true;
  }
  if (auto c = connection_.lock()) c->PostEndStream();
}

void ExchangeImpl::OnClientGone(std::function<void()> callback) {
  {
    std::lock_guard lock(mu_);
    if (!gone_) {
      on_gone_ = std::move(callback);
      return;
    }
  }
  if (callback) callback();
}

bool ExchangeImpl::client_gone() const {
  std::lock_guard lock(mu_);
  return gone_;
}

void ExchangeImpl::MarkComplete() {
  std::lock_guard lock(mu_);
  complete_ = true;
  on_gone_ = nullptr;
}

void ExchangeImpl::MarkGone() {
  std::function<void()> callback;
  {
    std::lock_guard lock(mu_);
    if (gone_ || complete_) return;
    gone_ = true;
    callback = std::move(on_gone_);
  }
  if (callback) callback();
}

}  // namespace moeserve::daemon

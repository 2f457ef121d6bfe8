// HttpExchange over one server connection. The exchange holds the connection
// weakly: once the connection is gone, every call is a no-op and Write says
// kClientGone. It counts the stream bytes handed to the connection but not yet
// written, which is what bounds a client that stops reading.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "connection_base.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

class ExchangeImpl : public HttpExchange {
 public:
  ExchangeImpl(std::weak_ptr<ConnectionBase> connection, size_t max_unsent_bytes, std::atomic<uint64_t>* slow_cut_counter)
      : connection_(std::move(connection)), max_unsent_(max_unsent_bytes), slow_cut_(slow_cut_counter) {}

  void Reply(HttpResponse response) override;
  void BeginStream(int status, std::string content_type, HttpHeaders headers) override;
  WriteResult Write(std::string data) override;
  void EndStream() override;
  void OnClientGone(std::function<void()> callback) override;
  bool client_gone() const override;

  // From the connection (its strand).
  void Sent(size_t accounted) { unsent_.fetch_sub(accounted); }
  void MarkComplete();  // the answer is out: a later hang-up is no longer the request's business
  void MarkGone();      // the client is gone before the answer was out: runs the callback

 private:
  bool Start();  // first Reply/BeginStream wins

  std::weak_ptr<ConnectionBase> connection_;
  const size_t max_unsent_;
  std::atomic<uint64_t>* slow_cut_;
  std::atomic<size_t> unsent_{0};
  mutable std::mutex mu_;
  bool started_ = false, streaming_ = false, ended_ = false, gone_ = false, complete_ = false;
  std::function<void()> on_gone_;
};

}  // namespace moeserve::daemon

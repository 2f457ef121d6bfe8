// The operator's HTTPS server for admission webhooks (Boost.Beast over
// Asio with OpenSSL): POST bodies up to kMaxAdmissionReviewBytes to a
// handler, JSON answers back. It is small on purpose and separate from the
// daemon's front, which the operator may not depend on.
//
//  - TLS 1.2+ only; the certificate is swapped with SetCertificate, and each
//    new connection uses the newest one (connections in flight keep theirs).
//  - Limits: 16 KiB of headers, the body limit, 10 s to read a request and
//    30 s idle on keep-alive, at most 64 connections at once (more wait in
//    the listen backlog).
//  - Only POST is served (405 otherwise); the path is the handler's to judge.
//
// Thread safety: Start/Stop from one thread; SetCertificate and the
// accessors from any thread. The handler runs on connection threads,
// several at once.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "moeserve/operator/admission_certs.hpp"
#include "moeserve/operator/quota_admission.hpp"

namespace moeserve::op {

class WebhookServer {
 public:
  using Handler = std::function<AdmissionHttpAnswer(const std::string& path, std::string_view body)>;
  explicit WebhookServer(Handler handler);
  ~WebhookServer();

  // addr: "host:port" or ":port" (all interfaces); port 0 picks one.
  // Returns the bound port. Connections wait in the listen backlog until a
  // certificate is set.
  Result<int> Start(const std::string& addr);
  void Stop();
  Status SetCertificate(const KeyPair& pair);
  // The PEM certificate new connections are served with; "" before the first.
  std::string CertificatePem() const;
  uint64_t requests() const { return requests_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> requests_{0};
};

}  // namespace moeserve::op

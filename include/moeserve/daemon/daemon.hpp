// One moe-daemon: the bounded HTTP front (http_server.hpp) and everything behind it.
//
// Lifecycle: Create (config, API keys) -> Start (listens: /healthz and
// /readyz answer while weights are pulled or loaded; chat requests get 503
// until ready) -> LoadModel (finds the directory's model family in the
// registry, creates the Engine over it and the scheduler loop, chooses the
// chat format by the family, sets readiness "ready") -> Shutdown (readiness "draining",
// new chat requests 503, in-flight ones finish within the grace period, the
// rest are cancelled; then the listener closes).
//
// Routes: POST /v1/chat/completions, GET /v1/models, GET /v1/usage,
// GET /healthz, GET /readyz, GET /metrics. /v1/* need `Authorization: Bearer <key>` when an
// API keys file is configured; /metrics then needs the metrics token (or an
// admin key). Without keys the daemon refuses to listen beyond loopback
// unless allow_unauthenticated is set. Authentication, routing and the body
// limit are decided from the request head, before the body is read.
//
// Thread safety: Start, LoadModel and Shutdown from the owning thread;
// requests are served on the HTTP front's threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/model/readiness.hpp"
#include "moeserve/daemon/http/routes.hpp"

namespace moeserve::daemon {

class DaemonMetrics;
class Scheduler;

class Daemon {
 public:
  static Result<std::unique_ptr<Daemon>> Create(DaemonConfig config);
  ~Daemon();

  Status Start();
  Status LoadModel();
  void Shutdown(double grace_seconds);

  std::string url() const;  // http://host:port, or https:// with TLS
  Readiness& readiness();
  DaemonMetrics& metrics();
  // Sequences with a client waiting on them (0 before LoadModel).
  size_t InFlight() const;
  // Every HTTP route this daemon answers (routes.hpp).
  std::vector<RouteDescription> Routes() const;

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::daemon

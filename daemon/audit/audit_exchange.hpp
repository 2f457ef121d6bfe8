// The exchange the daemon hands to the chat and session handlers when the
// audit log is on: everything passes through to the client, except the
// acknowledgement, which waits until the request's audit line is on disk
// (audit_log.hpp, group commit). For a JSON answer that is the whole
// response; for a stream the events go out as they come and only
// `data: [DONE]` (a Responses API stream: its response.completed or
// response.incomplete event) and the end of the stream are held back. A stream that
// ends without [DONE] or a client that hung up is logged without waiting.
// If the line cannot be written the client gets a 500 (or, mid-stream, an
// error event) instead of the acknowledgement.
//
// The line: {"time", "request_id", "tenant", "key_id", "method", "endpoint",
// "model", "tier", "status", "tokens": {"prompt", "cached", "completion",
// "reasoning"}, "completion_id", "session_id", "stream"} and, only with
// audit_log_content, "content": {"request", "response"}. key_id is the
// first 16 hex digits of the key's SHA-256, never the key. The request id is
// also sent to the client as X-Request-Id.
//
// Thread safety: the HttpExchange methods may be called from any thread;
// they are serialised by a mutex.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/audit/audit_log.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

struct AuditContext {
  std::string tenant;
  std::string key_id;       // "" without a key
  std::string method;
  std::string endpoint;     // the path, a session id replaced by {id}
  std::string session_id;   // from the path, or a created session's id
  std::string model;
  std::string request_body; // kept only with audit_log_content
};

// The audit key id of an Authorization header value: 16 hex digits of the
// bearer key's SHA-256, or "" without one.
std::string AuditKeyId(const std::string& authorization);

class AuditExchange : public HttpExchange, public std::enable_shared_from_this<AuditExchange> {
 public:
  AuditExchange(std::shared_ptr<HttpExchange> client, std::shared_ptr<AuditLog> log, AuditContext context);
  ~AuditExchange() override;

  void Reply(HttpResponse response) override;
  void BeginStream(int status, std::string content_type, HttpHeaders headers) override;
  WriteResult Write(std::string data) override;
  void EndStream() override;
  void OnClientGone(std::function<void()> callback) override { client_->OnClientGone(std::move(callback)); }
  bool client_gone() const override { return client_->client_gone(); }
  void NoteCompletion(const CompletionNote& note) override;

 private:
  std::string LineLocked(int status) const;
  // Queues the request's line as its tenant's (its bytes count towards the
  // tenant's share of the audit log: audit_log.hpp).
  void Log(std::string line, AuditLog::Done done);
  void NoteStreamEvent(const std::string& data);  // under mu_

  std::shared_ptr<HttpExchange> client_;
  std::shared_ptr<AuditLog> log_;  // shared: an exchange may outlive the daemon's handlers
  AuditContext context_;
  std::string request_id_;
  std::mutex mu_;
  CompletionNote note_;
  bool noted_ = false;
  bool logged_ = false;
  bool streaming_ = false;
  int stream_status_ = 0;
  bool stream_error_ = false;
  bool done_held_ = false;       // [DONE] waits for the line
  bool end_after_done_ = false;  // EndStream came while [DONE] waited
  std::string response_text_;    // audit_log_content: what the answer said
};

}  // namespace moeserve::daemon

// Server-kept sessions (api.md "Sessions"): POST /v1/sessions,
// GET /v1/sessions/{id}[?full=1], DELETE /v1/sessions/{id} and
// POST /v1/sessions/{id}/chat/completions.
//
// A turn posts only its new messages. The service renders the session's
// history (session_history.hpp) with them, compressing the oldest exchanges
// into a summary when they would not fit the context budget, and runs the
// whole conversation through ChatService like a stateless request, so
// validation, admission, charging and the answer's shape are the stateless
// endpoint's. The answer passes through SessionTurnExchange, which holds the
// acknowledgement (the JSON body, or a stream's [DONE]) until the turn (its
// messages, the answer and any summary) is committed in one transaction
// (session_store.hpp).
//
// Decisions:
// - Concurrent turns on one session: the second gets 409 session_busy at
//   once rather than waiting. Its messages were written without the first
//   turn's answer, so appending them after it would build a conversation the
//   client never saw; the client must read the answer and decide again.
// - Another tenant's session is 404 session_not_found, as an unknown one.
// - Several replicas: an id is sess_<replica>_<24 letters and digits>. A
//   request for another replica's session is forwarded to it
//   (session_peers), streaming included; the forwarded request carries
//   X-MoE-Session-Forwarded so that it is never forwarded again.
// - The model writes the summary (low tier, SummarizationPrompt) after the
//   turn that needed it was acknowledged; until then, and when the model's
//   text is not shorter than what it replaces, the extractive summary stands.
// - What depends on the model family (counting a prompt and an entry,
//   generating and reading a summary, pinning) is the chat dialect given at
//   Attach (ChatDialect's session methods, chat/dialect.hpp); the rest is the
//   same for every family. The store keeps every entry; the family's
//   renderer decides what of it the prompt shows (a family may drop
//   reasoning before a final answer).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/usage/budget_service.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"
#include "moeserve/daemon/completions/scheduler.hpp"
#include "moeserve/daemon/sessions/session_settings.hpp"
#include "moeserve/daemon/sessions/session_store.hpp"

namespace moeserve::daemon {

class PeerForwarder;  // session_forward.hpp

class SessionService {
 public:
  using Clock = std::chrono::steady_clock;
  // `db_path` empty: in memory.
  static Result<std::unique_ptr<SessionService>> Create(SessionSettings settings, std::string db_path,
                                                        BudgetService& budget);
  ~SessionService();

  // Once the model is loaded: turns run through `chat`; summaries through
  // `scheduler`; `model` counts, summarises and pins as the family does.
  void Attach(ChatService& chat, Scheduler& scheduler, std::shared_ptr<const ChatDialect> model);

  // The routes (daemon.cpp's route table matches method and path, and hands
  // over the {id} segment).
  // POST /v1/sessions.
  void Create(std::string body, std::shared_ptr<HttpExchange> exchange, const Principal& who);
  // What a turn decides from its head: one for a session this replica owns
  // needs the model (`serving`); another's is forwarded to its owner.
  ApiResult<void> AdmitTurn(const HttpHead& head, const std::string& id, bool serving) const;
  // GET and DELETE /v1/sessions/{id}, POST /v1/sessions/{id}/chat/completions:
  // run here when this replica owns the session, else forwarded to its owner.
  enum class Op { kGet, kDelete, kTurn };
  void OnSession(Op op, const std::string& id, const HttpHead& head, std::string body,
                 std::shared_ptr<HttpExchange> exchange, const Principal& who, Clock::time_point received);

  SessionStore& store() { return *store_; }
  const SessionSettings& settings() const { return settings_; }

  struct Impl;

 private:
  SessionService(SessionSettings settings, BudgetService& budget);
  SessionSettings settings_;
  BudgetService& budget_;
  std::unique_ptr<PeerForwarder> forwarder_;
  std::unique_ptr<SessionStore> store_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace moeserve::daemon

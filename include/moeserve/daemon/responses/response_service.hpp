// The OpenAI Responses API (docs/http-api.md "Responses"):
// POST /v1/responses, GET and DELETE /v1/responses/{id} and
// POST /v1/responses/{id}/cancel.
//
// A request is translated into a chat completion (response_request.hpp) and
// run by ChatService, so rendering, constrained decoding, tiers, budgets,
// rate limits, metrics and the error shape are the chat path's; its answer
// comes back translated (response_exchange.hpp) and, unless store is false,
// is stored (response_store.hpp) before the client sees it.
//
// Decisions:
// - previous_response_id continues the stored conversation of that response
//   (its instructions are not carried over, as OpenAI does). Another
//   tenant's response is 404 exactly like a missing one.
// - Ids are resp_<replica>_<24 letters and digits>, the replica as in session
//   ids: a request naming a response of another replica (by path, or by
//   previous_response_id) is forwarded to it with the sessions' forwarder
//   and runs there; a forwarded request is never forwarded again.
// - background: true answers at once with status in_progress; the run goes on
//   without a client, is charged like any other, and its end (completed,
//   incomplete, failed) replaces the stored row. Cancel stops it (the tokens
//   made until then are charged) and stores it as cancelled. A background
//   run that a restart interrupted reads as failed. With the audit log on,
//   the request's answer and the run each get a line (the run's with its
//   tokens, or 499 when cancelled).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/keys/api_keys.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"
#include "moeserve/daemon/responses/response_request.hpp"
#include "moeserve/daemon/responses/response_store.hpp"
#include "moeserve/daemon/sessions/session_settings.hpp"

namespace moeserve::daemon {

class PeerForwarder;     // session_forward.hpp

class ResponseService {
 public:
  using Clock = std::chrono::steady_clock;
  // Stores in the sessions' database; replica, peers and the per-tenant
  // storage quota are the sessions' settings.
  static Result<std::unique_ptr<ResponseService>> Create(const SessionSettings& settings, SessionStore& store);
  ~ResponseService();

  // Once the model is loaded.
  void Attach(ChatService& chat) { chat_.store(&chat); }

  // Wraps the exchange a background run answers through (the audit log:
  // the run gets its own line, with its tokens); empty: none.
  using RunExchange = std::function<std::shared_ptr<HttpExchange>(std::shared_ptr<HttpExchange>)>;
  void Create(const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange, const Principal& who,
              Clock::time_point received, const RunExchange& audit_run = {});
  void Get(const std::string& id, const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange,
           const Principal& who);
  void Delete(const std::string& id, const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange,
           const Principal& who);
  void Cancel(const std::string& id, const HttpHead& head, std::string body, std::shared_ptr<HttpExchange> exchange,
           const Principal& who);

 private:
  struct Run;  // a background response running on this replica
  explicit ResponseService(const SessionSettings& settings);
  // Forwards to the replica that owns `id` and returns true, or returns false
  // when this replica owns it; answers 404 itself for an id no replica owns.
  bool ForwardIfElsewhere(const std::string& id, const HttpHead& head, std::string& body,
                          std::shared_ptr<HttpExchange>& exchange, bool& answered);
  // For GET, DELETE and cancel of a stored response: true when the request
  // went to the owning replica or was answered 404 (an id no replica made).
  bool AnsweredElsewhere(const std::string& id, const HttpHead& head, std::string& body,
                         std::shared_ptr<HttpExchange>& exchange);
  std::shared_ptr<Run> FindRun(const std::string& tenant, const std::string& id);
  // Marks a background run ended; true when it was still running.
  static bool MarkEnded(Run& run);
  // Takes a run off this replica's list and cancels its exchange.
  void StopRun(const std::string& id, Run& run);
  // The images of a request (stored_images.hpp): its input_image parts
  // decoded and renamed by hash in req.messages, the previous response's
  // decoded from the store.
  struct ResponseImages {
    StoredImages pixels;                 // by hash: what the chat body names
    std::vector<StoredImageFile> files;  // what the stored row keeps, each once
  };
  // Fetches and decodes (on an image worker: it blocks); the history's kept
  // images come from the decoded-image cache where it holds them.
  ApiResult<ResponseImages> RequestImages(ResponsesRequest& req, const nlohmann::ordered_json& history,
                                          ImagePartPlan plan, const ServingFacts& facts,
                                          const std::string& tenant) const;
  // Create once the request is admitted (`admitted` null: it has no image
  // work, and ChatService admits it as any other).
  struct Creation {
    ResponsesRequest req;
    nlohmann::ordered_json history;
    ImagePartPlan plan;
    std::shared_ptr<HttpExchange> exchange;
    Principal who;
    Clock::time_point received;
    RunExchange audit_run;
    std::shared_ptr<ChatService::EarlyAdmission> admitted;
  };
  void CreateAdmitted(ChatService& chat, Creation c);
  void Background(ResponsesRequest req, nlohmann::ordered_json history, nlohmann::ordered_json shell,
                  std::string chat_body, std::shared_ptr<HttpExchange> exchange, const Principal& who,
                  Clock::time_point received, const RunExchange& audit_run, ResponseImages images,
                  std::shared_ptr<ChatService::EarlyAdmission> admitted);

  SessionSettings settings_;
  std::unique_ptr<ResponseStore> store_;
  std::unique_ptr<PeerForwarder> forwarder_;
  std::atomic<ChatService*> chat_{nullptr};
  std::mutex runs_mu_;
  std::map<std::string, std::shared_ptr<Run>> runs_;  // by response id
};

}  // namespace moeserve::daemon

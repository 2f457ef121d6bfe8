// The exchange a Responses request hands to ChatService in place of the
// client's: it translates the chat completion's answer into the Responses
// API on the way out. A JSON answer becomes the response object; a stream of
// chat chunks becomes the semantic events (response_events.hpp); an error
// keeps its status and shape with its `param` renamed into the Responses
// request's terms (RenameChatError).
//
// A finished answer is handed to `on_answer` (which stores it) together with
// a function that sends it and one that sends an error instead; until one of
// them runs, the client has neither the body nor response.completed, so a
// response the client saw is stored. A failed one goes to `on_failure`.
//
// Without a client (a background response) nothing is sent: the answer only
// reaches `on_answer`, the run never learns of a hang-up, and Cancel() stops
// it as a hang-up would (the tokens made until then are charged).
//
// Thread safety: the HttpExchange methods and Cancel may be called from any
// thread; they are serialised by a mutex (the callbacks run outside it).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"
#include "moeserve/daemon/responses/response_request.hpp"
#include "moeserve/daemon/responses/response_events.hpp"

namespace moeserve::daemon {

class ResponseExchange : public HttpExchange, public std::enable_shared_from_this<ResponseExchange> {
 public:
  using Release = std::function<void()>;
  using Refuse = std::function<void(const ApiError&)>;
  // `on_answer` must eventually call exactly one of release or refuse.
  using OnAnswer = std::function<void(nlohmann::ordered_json response, nlohmann::ordered_json conversation,
                                      Release release, Refuse refuse)>;
  using OnFailure = std::function<void(const ApiError&)>;

  struct Context {
    ResponsesRequest request;
    nlohmann::ordered_json history = nlohmann::ordered_json::array();  // the previous response's conversation
    nlohmann::ordered_json shell;                                      // the response object before any output
  };

  // `client` null: a background response.
  ResponseExchange(std::shared_ptr<HttpExchange> client, Context context, OnAnswer on_answer, OnFailure on_failure)
      : client_(std::move(client)), context_(std::move(context)), on_answer_(std::move(on_answer)),
        on_failure_(std::move(on_failure)) {}

  void Reply(HttpResponse response) override;
  void BeginStream(int status, std::string content_type, HttpHeaders headers) override;
  WriteResult Write(std::string data) override;
  void EndStream() override;
  void OnClientGone(std::function<void()> callback) override;
  bool client_gone() const override;
  void NoteCompletion(const CompletionNote& note) override {
    if (client_) client_->NoteCompletion(note);
  }

  // Background only: stops the run as if its client had hung up.
  void Cancel();

 private:
  ApiError ErrorOf(const HttpResponse& response) const;
  void Fail(const ApiError& e);

  std::shared_ptr<HttpExchange> client_;
  Context context_;
  OnAnswer on_answer_;
  OnFailure on_failure_;
  mutable std::mutex mu_;
  ResponseEventWriter events_;
  std::string pending_;  // stream bytes not yet split into events
  bool done_seen_ = false;
  bool failed_ = false;
  bool cancelled_ = false;
  std::function<void()> on_gone_;  // background: what Cancel runs
};

}  // namespace moeserve::daemon

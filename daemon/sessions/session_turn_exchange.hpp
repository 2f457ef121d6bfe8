// The exchange a session turn hands to ChatService in place of the client's:
// everything passes through to the client except the acknowledgement, which
// waits until the turn is stored. For a JSON answer that is the whole body;
// for a stream the events go out as they come and only `data: [DONE]` (and
// the end of the stream) is held back. The answer is assembled on the way
// (reasoning, content, tool calls) and handed to `on_answer` with a function
// that releases the held acknowledgement and one that turns it into an error.
//
// A failed turn (an error status, an error event, a stream cut short, a
// client that hung up) goes to the client as it is and calls `on_end(false)`;
// `on_end` runs exactly once, at the latest when the exchange is destroyed
// (a non-streamed answer to a client that hung up is never sent).
//
// Thread safety: the HttpExchange methods may be called from any thread;
// they are serialised by a mutex.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

struct AssembledAnswer {
  std::string content;
  std::string reasoning;
  struct Call {
    std::string id, name, arguments;
  };
  std::vector<Call> tool_calls;
};

// Made with std::make_shared: the held acknowledgement keeps it alive.
class SessionTurnExchange : public HttpExchange, public std::enable_shared_from_this<SessionTurnExchange> {
 public:
  using Release = std::function<void()>;
  using Refuse = std::function<void(const ApiError&)>;
  // `on_answer` must eventually call exactly one of release or refuse.
  using OnAnswer = std::function<void(AssembledAnswer answer, Release release, Refuse refuse)>;
  using OnEnd = std::function<void(bool acknowledged)>;

  SessionTurnExchange(std::shared_ptr<HttpExchange> client, OnAnswer on_answer, OnEnd on_end)
      : client_(std::move(client)), on_answer_(std::move(on_answer)), on_end_(std::move(on_end)) {}
  ~SessionTurnExchange() override;

  void Reply(HttpResponse response) override;
  void BeginStream(int status, std::string content_type, HttpHeaders headers) override;
  WriteResult Write(std::string data) override;
  void EndStream() override;
  void OnClientGone(std::function<void()> callback) override { client_->OnClientGone(std::move(callback)); }
  bool client_gone() const override { return client_->client_gone(); }
  void NoteCompletion(const CompletionNote& note) override { client_->NoteCompletion(note); }

 private:
  void Event(const std::string& payload);  // one SSE payload, under mu_
  void End(bool acknowledged);

  std::shared_ptr<HttpExchange> client_;
  OnAnswer on_answer_;
  OnEnd on_end_;
  std::mutex mu_;
  std::string pending_;  // stream bytes not yet split into events
  AssembledAnswer answer_;
  bool done_seen_ = false;
  bool failed_ = false;
  bool ended_ = false;
};

}  // namespace moeserve::daemon

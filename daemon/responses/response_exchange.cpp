#include "response_exchange.hpp"

#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/responses/response_output.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {
std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ApiError ErrorFromBody(int status, const ojson& body) {
  ApiError e;
  e.status = status;
  const ojson err = body.is_object() ? body.value("error", ojson::object()) : ojson::object();
  e.message = err.value("message", std::string("The request failed"));
  e.type = err.contains("type") && err["type"].is_string() ? err["type"].get<std::string>() : "server_error";
  e.code = err.contains("code") && err["code"].is_string() ? err["code"].get<std::string>() : e.type;
  e.param = err.contains("param") && err["param"].is_string() ? err["param"].get<std::string>() : "";
  return e;
}
}  // namespace

ApiError ResponseExchange::ErrorOf(const HttpResponse& response) const {
  ApiError e = ErrorFromBody(response.status, ojson::parse(response.body, nullptr, false));
  for (const auto& [name, value] : response.headers) {
    if (name == "Retry-After") {
      try {
        e.retry_after_seconds = std::stoi(value);
      } catch (...) {
      }
    }
  }
  return RenameChatError(std::move(e), context_.request, context_.history.size());
}

void ResponseExchange::Fail(const ApiError& e) {
  if (on_failure_) on_failure_(e);
}

void ResponseExchange::Reply(HttpResponse response) {
  ojson completion;
  if (response.status == 200) completion = ojson::parse(response.body, nullptr, false);
  if (response.status != 200 || !completion.is_object()) {
    const ApiError e = response.status == 200 ? ApiError::Internal("The chat completion could not be read") : ErrorOf(response);
    if (client_) ReplyError(*client_, e);
    Fail(e);
    return;
  }
  const ChatAnswer answer = ChatAnswerFrom(completion);
  ojson object = context_.shell;
  FinishResponse(object, OutputItems(answer), answer);
  ojson conversation = ConversationAfter(context_.history, context_.request, answer);
  auto headers = std::make_shared<HttpHeaders>(std::move(response.headers));
  auto self = shared_from_this();
  const std::string body = Dump(object);
  on_answer_(
      std::move(object), std::move(conversation),
      [self, headers, body] {
        if (self->client_) self->client_->Reply(HttpResponse{200, "application/json", std::move(*headers), body});
      },
      [self](const ApiError& e) {
        if (self->client_) ReplyError(*self->client_, e);
        self->Fail(e);
      });
}

void ResponseExchange::BeginStream(int status, std::string, HttpHeaders headers) {
  if (!client_) return;
  std::string start;
  {
    std::lock_guard lock(mu_);
    start = events_.Start(context_.shell);
  }
  client_->BeginStream(status, "text/event-stream", std::move(headers));
  client_->Write(std::move(start));
}

HttpExchange::WriteResult ResponseExchange::Write(std::string data) {
  if (!client_) return WriteResult::kClientGone;
  std::string forward;
  {
    std::lock_guard lock(mu_);
    pending_ += data;
    size_t pos = 0;
    for (;;) {
      const size_t end = pending_.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string event = pending_.substr(pos, end - pos);
      pos = end + 2;
      if (!event.starts_with("data: ")) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done_seen_ = true;
        continue;
      }
      const ojson chunk = ojson::parse(payload, nullptr, false);
      if (!chunk.is_object()) continue;
      if (chunk.contains("error")) {
        failed_ = true;
        ApiError e = RenameChatError(ErrorFromBody(500, chunk), context_.request, context_.history.size());
        forward += events_.Error(ojson::parse(Dump(e.ToJson()), nullptr, false));
        continue;
      }
      forward += events_.Chunk(chunk);
    }
    pending_.erase(0, pos);
  }
  if (forward.empty()) return client_->client_gone() ? WriteResult::kClientGone : WriteResult::kQueued;
  return client_->Write(std::move(forward));
}

void ResponseExchange::EndStream() {
  if (!client_) return;
  bool commit;
  std::string closing;
  ojson object, conversation;
  {
    std::lock_guard lock(mu_);
    commit = done_seen_ && !failed_;
    if (commit) {
      closing = events_.CloseOpenItem();
      object = context_.shell;
      FinishResponse(object, events_.output(), events_.answer());
      conversation = ConversationAfter(context_.history, context_.request, events_.answer());
    }
  }
  if (!commit) {
    client_->EndStream();
    Fail(ApiError::Internal("The stream ended before the response was complete"));
    return;
  }
  auto self = shared_from_this();
  const ojson final_object = object;
  on_answer_(
      std::move(object), std::move(conversation),
      [self, closing, final_object] {
        std::string tail;
        {
          std::lock_guard lock(self->mu_);
          tail = closing + self->events_.Finish(final_object);
        }
        self->client_->Write(std::move(tail));
        self->client_->EndStream();
      },
      [self, closing](const ApiError& e) {
        std::string tail;
        {
          std::lock_guard lock(self->mu_);
          tail = closing + self->events_.Error(ojson::parse(Dump(e.ToJson()), nullptr, false));
        }
        self->client_->Write(std::move(tail));
        self->client_->EndStream();
        self->Fail(e);
      });
}

void ResponseExchange::OnClientGone(std::function<void()> callback) {
  if (client_) return client_->OnClientGone(std::move(callback));
  bool now;
  {
    std::lock_guard lock(mu_);
    now = cancelled_;
    if (!now) on_gone_ = callback;
  }
  if (now) callback();
}

bool ResponseExchange::client_gone() const {
  if (client_) return client_->client_gone();
  std::lock_guard lock(mu_);
  return cancelled_;
}

void ResponseExchange::Cancel() {
  std::function<void()> gone;
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    gone = std::move(on_gone_);
  }
  if (gone) gone();
}

}  // namespace moeserve::daemon

#include "sessions/session_turn_exchange.hpp"

#include "moeserve/daemon/completions/chat_service.hpp"

namespace moeserve::daemon {

using json = nlohmann::json;

SessionTurnExchange::~SessionTurnExchange() { End(false); }

void SessionTurnExchange::End(bool acknowledged) {
  OnEnd end;
  {
    std::lock_guard lock(mu_);
    if (ended_) return;
    ended_ = true;
    end = std::move(on_end_);
  }
  if (end) end(acknowledged);
}

namespace {

AssembledAnswer FromMessage(const json& message) {
  AssembledAnswer a;
  if (message.contains("content") && message["content"].is_string()) a.content = message["content"];
  if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
    a.reasoning = message["reasoning_content"];
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    for (const auto& c : message["tool_calls"]) {
      a.tool_calls.push_back(
          {c.value("id", ""), c["function"].value("name", ""), c["function"].value("arguments", "")});
    }
  }
  return a;
}

}  // namespace

void SessionTurnExchange::Reply(HttpResponse response) {
  json body;
  if (response.status == 200) body = json::parse(response.body, nullptr, false);
  const bool ok = response.status == 200 && body.is_object() && body.contains("choices") && !body["choices"].empty();
  if (!ok) {
    client_->Reply(std::move(response));
    End(false);
    return;
  }
  auto answer = FromMessage(body["choices"][0]["message"]);
  auto shared = std::make_shared<HttpResponse>(std::move(response));
  auto self = shared_from_this();
  on_answer_(
      std::move(answer),
      [self, shared] {
        // The session is free again before the client can send its next turn.
        self->End(true);
        self->client_->Reply(std::move(*shared));
      },
      [self](const ApiError& e) {
        ReplyError(*self->client_, e);
        self->End(false);
      });
}

void SessionTurnExchange::BeginStream(int status, std::string content_type, HttpHeaders headers) {
  client_->BeginStream(status, std::move(content_type), std::move(headers));
}

void SessionTurnExchange::Event(const std::string& payload) {
  if (payload == "[DONE]") {
    done_seen_ = true;
    return;
  }
  auto j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("error")) {
    failed_ = true;
    return;
  }
  if (!j.contains("choices") || !j["choices"].is_array()) return;
  for (const auto& choice : j["choices"]) {
    const auto& d = choice.value("delta", json::object());
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
      answer_.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) answer_.content += d["content"].get<std::string>();
    if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
      for (const auto& t : d["tool_calls"]) {
        const size_t index = t.value("index", 0);
        if (answer_.tool_calls.size() <= index) answer_.tool_calls.resize(index + 1);
        auto& call = answer_.tool_calls[index];
        if (t.contains("id") && t["id"].is_string()) call.id = t["id"];
        if (t.contains("function")) {
          const auto& fn = t["function"];
          if (fn.contains("name") && fn["name"].is_string()) call.name = fn["name"];
          if (fn.contains("arguments") && fn["arguments"].is_string())
            call.arguments += fn["arguments"].get<std::string>();
        }
      }
    }
  }
}

HttpExchange::WriteResult SessionTurnExchange::Write(std::string data) {
  std::string forward;
  {
    std::lock_guard lock(mu_);
    pending_ += data;
    size_t pos = 0;
    for (;;) {
      size_t end = pending_.find("\n\n", pos);
      if (end == std::string::npos) break;
      std::string event = pending_.substr(pos, end + 2 - pos);
      pos = end + 2;
      std::string payload = event.starts_with("data: ") ? event.substr(6, event.size() - 8) : std::string();
      Event(payload);
      // [DONE] is the acknowledgement: it waits for the store.
      if (payload != "[DONE]") forward += event;
    }
    pending_.erase(0, pos);
  }
  if (forward.empty()) return WriteResult::kQueued;
  return client_->Write(std::move(forward));
}

void SessionTurnExchange::EndStream() {
  bool commit;
  {
    std::lock_guard lock(mu_);
    commit = done_seen_ && !failed_;
  }
  if (!commit) {
    bool done;
    {
      std::lock_guard lock(mu_);
      done = done_seen_;
    }
    if (done) client_->Write("data: [DONE]\n\n");
    client_->EndStream();
    End(false);
    return;
  }
  auto self = shared_from_this();
  on_answer_(
      answer_,
      [self] {
        self->End(true);
        self->client_->Write("data: [DONE]\n\n");
        self->client_->EndStream();
      },
      [self](const ApiError& e) {
        self->client_->Write("data: " + e.ToJson().dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
        self->client_->Write("data: [DONE]\n\n");
        self->client_->EndStream();
        self->End(false);
      });
}

}  // namespace moeserve::daemon

#include "audit/audit_exchange.hpp"

#include <random>

#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"

namespace moeserve::daemon {

using json = nlohmann::json;

namespace {

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<int> pick(0, 35);
  std::string id = "req_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

// The text of a chat answer, streamed (a chunk's delta) or not (the message).
void AppendAnswerText(const json& choice_part, std::string& out) {
  for (const char* field : {"reasoning_content", "content"}) {
    auto it = choice_part.find(field);
    if (it != choice_part.end() && it->is_string()) out += it->get<std::string>();
  }
  auto calls = choice_part.find("tool_calls");
  if (calls != choice_part.end() && calls->is_array())
    for (const auto& c : *calls)
      if (c.contains("function") && c["function"].is_object()) out += c["function"].dump();
}

// The text of a Responses API object's output items (reasoning summaries,
// message text, function calls).
void AppendResponseText(const json& output, std::string& out) {
  for (const auto& item : output) {
    if (!item.is_object()) continue;
    for (const char* list : {"summary", "content"}) {
      auto parts = item.find(list);
      if (parts != item.end() && parts->is_array())
        for (const auto& p : *parts)
          if (p.is_object() && p.contains("text") && p["text"].is_string()) out += p["text"].get<std::string>();
    }
    if (item.value("type", "") == "function_call") out += json{{"name", item.value("name", "")}, {"arguments", item.value("arguments", "")}}.dump();
  }
}

// A Responses API stream's last event: what [DONE] is to a chat stream.
bool EndsResponsesStream(const std::string& data) {
  return data.find("event: response.completed\n") != std::string::npos ||
         data.find("event: response.incomplete\n") != std::string::npos;
}

ApiError AuditFailure(const Status& st) {
  return ApiError::Internal("The audit log could not record this request (" + st.error().message() +
                            "); it was not acknowledged");
}

}  // namespace

std::string AuditKeyId(const std::string& authorization) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() <= kBearer.size() || !authorization.starts_with(kBearer)) return "";
  return Sha256Hex(std::string_view(authorization).substr(kBearer.size())).substr(0, 16);
}

AuditExchange::AuditExchange(std::shared_ptr<HttpExchange> client, std::shared_ptr<AuditLog> log, AuditContext context)
    : client_(std::move(client)), log_(log), context_(std::move(context)), request_id_(NewRequestId()) {
  if (!log_->settings().log_content) context_.request_body.clear();
}

AuditExchange::~AuditExchange() {
  // Never answered (a non-streamed answer to a client that hung up is
  // dropped): logged as 499, nothing to hold back.
  std::lock_guard lock(mu_);
  if (!logged_) Log(LineLocked(streaming_ ? stream_status_ : 499), nullptr);
}

void AuditExchange::NoteCompletion(const CompletionNote& note) {
  std::lock_guard lock(mu_);
  note_ = note;
  noted_ = true;
}

void AuditExchange::Log(std::string line, AuditLog::Done done) {
  log_->Append(std::move(line), std::move(done), AuditLineKind::kRequest, context_.tenant);
}

std::string AuditExchange::LineLocked(int status) const {
  json line = {{"time", NowMicroTime()},
               {"request_id", request_id_},
               {"tenant", context_.tenant},
               {"key_id", context_.key_id.empty() ? json(nullptr) : json(context_.key_id)},
               {"method", context_.method},
               {"endpoint", context_.endpoint},
               {"model", context_.model},
               {"tier", noted_ ? json(note_.tier) : json(nullptr)},
               {"status", status},
               {"stream", streaming_},
               {"tokens",
                {{"prompt", noted_ ? note_.prompt_tokens : 0},
                 {"cached", noted_ ? note_.cached_tokens : 0},
                 {"completion", noted_ ? note_.completion_tokens : 0},
                 {"reasoning", noted_ ? note_.reasoning_tokens : 0}}},
               {"completion_id", noted_ ? json(note_.id) : json(nullptr)},
               {"session_id", context_.session_id.empty() ? json(nullptr) : json(context_.session_id)}};
  if (streaming_ && stream_error_) line["stream_error"] = true;
  if (log_->settings().log_content) {
    json request = json::parse(context_.request_body, nullptr, false);
    line["content"] = {{"request", request.is_discarded() ? json(context_.request_body) : request},
                       {"response", response_text_}};
  }
  return line.dump(-1, ' ', false, json::error_handler_t::replace);
}

void AuditExchange::Reply(HttpResponse response) {
  std::string line;
  bool first;
  {
    std::lock_guard lock(mu_);
    first = !logged_ && !streaming_;  // only the first answer counts
    if (first) logged_ = true;
  }
  if (!first) return client_->Reply(std::move(response));
  {
    std::lock_guard lock(mu_);
    if (response.content_type.starts_with("application/json") &&
        (log_->settings().log_content || (context_.method == "POST" && context_.endpoint == "/v1/sessions"))) {
      const json body = json::parse(response.body, nullptr, false);
      if (body.is_object()) {
        if (context_.endpoint == "/v1/sessions" && body.contains("id") && body["id"].is_string())
          context_.session_id = body["id"];
        if (body.contains("choices") && body["choices"].is_array())
          for (const auto& c : body["choices"])
            if (c.contains("message")) AppendAnswerText(c["message"], response_text_);
        if (body.contains("output") && body["output"].is_array()) AppendResponseText(body["output"], response_text_);
      }
    }
    line = LineLocked(response.status);
  }
  response.headers.emplace_back("X-Request-Id", request_id_);
  Log(std::move(line), [self = shared_from_this(), response = std::move(response)](const Status& st) mutable {
    if (!st) {
      log::Error(st.error().ToString());
      HttpResponse failed = ErrorResponse(AuditFailure(st));
      failed.headers.emplace_back("X-Request-Id", self->request_id_);
      return self->client_->Reply(std::move(failed));
    }
    self->client_->Reply(std::move(response));
  });
}

void AuditExchange::BeginStream(int status, std::string content_type, HttpHeaders headers) {
  {
    std::lock_guard lock(mu_);
    if (!logged_ && !streaming_) {
      streaming_ = true;
      stream_status_ = status;
    }
  }
  headers.emplace_back("X-Request-Id", request_id_);
  client_->BeginStream(status, std::move(content_type), std::move(headers));
}

void AuditExchange::NoteStreamEvent(const std::string& data) {
  constexpr std::string_view kData = "data: ";
  size_t pos = 0;
  while ((pos = data.find(kData, pos)) != std::string::npos) {
    size_t end = data.find("\n\n", pos);
    const std::string payload = data.substr(pos + kData.size(), end == std::string::npos ? std::string::npos : end - pos - kData.size());
    pos = end == std::string::npos ? data.size() : end;
    // A chat stream's error chunk, or a Responses stream's error event.
    if (payload.starts_with("{\"error\"") || payload.starts_with("{\"type\":\"error\"")) stream_error_ = true;
    if (!log_->settings().log_content || payload.empty() || payload[0] != '{') continue;
    const json chunk = json::parse(payload, nullptr, false);
    if (chunk.is_object() && chunk.contains("delta") && chunk["delta"].is_string() && chunk.contains("type") &&
        chunk["type"].is_string() && chunk["type"].get<std::string>().starts_with("response.")) {
      response_text_ += chunk["delta"].get<std::string>();  // a Responses stream's text, reasoning or arguments
    }
    if (chunk.is_object() && chunk.contains("choices") && chunk["choices"].is_array())
      for (const auto& c : chunk["choices"])
        if (c.contains("delta")) AppendAnswerText(c["delta"], response_text_);
  }
}

HttpExchange::WriteResult AuditExchange::Write(std::string data) {
  // The client's methods are called outside mu_: a write may run the
  // client-gone callback, which may come back here.
  std::string line;
  bool done;
  {
    std::lock_guard lock(mu_);
    done = !logged_ && (data.find("data: [DONE]") != std::string::npos || EndsResponsesStream(data));
    NoteStreamEvent(data);
    if (done) {
      logged_ = true;
      line = LineLocked(stream_status_);  // an error event sets stream_error
      done_held_ = true;
    }
  }
  if (!done) return client_->Write(std::move(data));
  if (client_->client_gone()) {  // nothing will reach the client: log, do not hold
    {
      std::lock_guard lock(mu_);
      done_held_ = false;
    }
    Log(std::move(line), nullptr);
    return WriteResult::kClientGone;
  }
  Log(std::move(line), [self = shared_from_this(), data = std::move(data)](const Status& st) mutable {
    bool end;
    {
      std::lock_guard lock(self->mu_);
      self->done_held_ = false;
      end = self->end_after_done_;
    }
    if (!st) {
      log::Error(st.error().ToString());
      self->client_->Write("data: " + AuditFailure(st).ToJson().dump() + "\n\n");  // no [DONE]: not acknowledged
    } else {
      self->client_->Write(std::move(data));
    }
    if (end) self->client_->EndStream();
  });
  return WriteResult::kQueued;
}

void AuditExchange::EndStream() {
  std::string line;
  {
    std::lock_guard lock(mu_);
    if (done_held_) {
      end_after_done_ = true;
      return;
    }
    if (!logged_) {  // ended without [DONE]: not acknowledged, logged as cut short
      logged_ = true;
      stream_error_ = true;
      line = LineLocked(stream_status_);
    }
  }
  if (!line.empty()) Log(std::move(line), nullptr);
  client_->EndStream();
}

}  // namespace moeserve::daemon

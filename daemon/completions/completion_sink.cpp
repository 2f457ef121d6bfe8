#include "completions/completion_sink.hpp"

#include <cmath>

#include "moeserve/common/log.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/completions/logprobs_json.hpp"

namespace moeserve::daemon {

using json = nlohmann::json;

CompletionSink::CompletionSink(CompletionInfo info, std::shared_ptr<HttpExchange> exchange, Scheduler& scheduler,
                               DaemonMetrics& metrics, BudgetService& budget)
    : info_(std::move(info)),
      exchange_(std::move(exchange)),
      scheduler_(scheduler),
      metrics_(metrics),
      budget_(budget),
      reader_(info_.turn->Reader(info_.stop, info_.call_id_seed)),
      assembler_(*reader_),
      sse_(exchange_) {
  // The role chunk goes first, before any event can.
  if (info_.stream) sse_.Send(Chunk({{"role", "assistant"}, {"content", ""}}, nullptr).dump());
}

void CompletionSink::BeginStream() {
  HttpHeaders extra;
  if (info_.downgraded) extra.emplace_back("X-MoE-Downgraded", "budget");
  sse_.Begin(std::move(extra));
}

void CompletionSink::SetSequence(engine::SequenceId id) {
  bool cancel;
  {
    std::lock_guard lock(id_mu_);
    sequence_ = id;
    cancel = cancel_requested_;
  }
  if (cancel) scheduler_.Cancel(id);
}

void CompletionSink::OnDisconnect() {
  if (disconnected_.exchange(true)) return;
  metrics_.AddClientDisconnect();
  std::optional<engine::SequenceId> id;
  {
    std::lock_guard lock(id_mu_);
    id = sequence_;
    cancel_requested_ = true;
  }
  if (id) scheduler_.Cancel(*id);
}

void CompletionSink::AbortStream(const json& error_body, bool done) {
  sse_.Send(error_body.dump());
  if (done) sse_.Send("[DONE]");
  sse_.Close();
}

json CompletionSink::Chunk(json delta, const char* finish_reason, json logprobs) const {
  json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}};
  json chunk = {{"id", info_.id},       {"object", "chat.completion.chunk"}, {"created", info_.created},
                {"model", info_.model}, {"system_fingerprint", nullptr},     {"choices", json::array({choice})}};
  if (info_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json CompletionSink::Usage(const engine::SequenceUsage& u) const {
  json usage = {{"prompt_tokens", u.prompt_tokens},
                {"completion_tokens", u.completion_tokens},
                {"total_tokens", u.prompt_tokens + u.completion_tokens},
                {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
                {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  // Image spans are prompt tokens (counted above, charged like text); this says how many.
  if (info_.image_tokens > 0) usage["prompt_tokens_details"]["image_tokens"] = info_.image_tokens;
  return usage;
}

void CompletionSink::SendDelta(const OutputDelta& d) {
  if (!info_.stream || d.empty()) return;
  if (!d.reasoning.empty()) sse_.Send(Chunk({{"reasoning_content", d.reasoning}}, nullptr).dump());
  if (!d.content.empty() || !d.logprobs.empty()) {
    sse_.Send(Chunk({{"content", d.content}}, nullptr, info_.logprobs ? LogprobsJson(d.logprobs, info_.logprobs_tokenizer) : json(nullptr)).dump());
  }
  if (!d.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& t : d.tool_calls) {
      json c = {{"index", t.index}};
      json fn = {{"arguments", t.arguments}};
      if (t.id) {
        c["id"] = *t.id;
        c["type"] = "function";
      }
      if (t.name) fn["name"] = *t.name;
      c["function"] = std::move(fn);
      calls.push_back(std::move(c));
    }
    sse_.Send(Chunk({{"tool_calls", std::move(calls)}}, nullptr).dump());
  }
}

void CompletionSink::OnEvent(const engine::TokenEvent& e) {
  const auto now = std::chrono::steady_clock::now();
  if (e.token >= 0) {
    if (!last_token_at_) {
      metrics_.ObserveTimeToFirstToken(std::chrono::duration<double>(now - info_.received).count());
    } else {
      metrics_.ObserveInterTokenLatency(std::chrono::duration<double>(now - *last_token_at_).count());
    }
    last_token_at_ = now;
    std::optional<ContentLogprob> lp;
    if (info_.logprobs && e.logprob) lp = ContentLogprob{e.token, *e.logprob, e.top_logprobs};
    OutputDelta delta = assembler_.OnToken(e.token, e.reasoning, lp ? &*lp : nullptr);
    if (e.finish == engine::FinishReason::kNone) SendDelta(delta);
    else withheld_.push_back(std::move(delta));  // after the charge (Complete)
    if (assembler_.StopMatched() && !stop_cancel_sent_ && e.finish == engine::FinishReason::kNone) {
      // A stop string ended the answer: free the sequence now.
      stop_cancel_sent_ = true;
      scheduler_.Cancel(e.id);
    }
  }
  if (e.finish != engine::FinishReason::kNone) Finish(e);
}

void CompletionSink::Finish(const engine::TokenEvent& e) {
  withheld_.push_back(assembler_.Finish());
  if (std::string fault = assembler_.FormatFault(); !fault.empty()) {
    log::Warn("completion " + info_.id + ": the model's output broke the chat format (" + fault +
              "); answered with what was read before");
    metrics_.AddOutputFormatError();
  }
  const auto& u = e.usage;
  metrics_.AddTokens(info_.tenant, info_.tier, "input", static_cast<uint64_t>(u.prompt_tokens - u.cached_tokens));
  metrics_.AddTokens(info_.tenant, info_.tier, "cached_input", static_cast<uint64_t>(u.cached_tokens));
  metrics_.AddTokens(info_.tenant, info_.tier, "reasoning", static_cast<uint64_t>(u.reasoning_tokens));
  metrics_.AddTokens(info_.tenant, info_.tier, "output", static_cast<uint64_t>(u.completion_tokens - u.reasoning_tokens));
  if (assembler_.tool_call_parse_errors() > 0) metrics_.AddToolCallParseErrors(assembler_.tool_call_parse_errors());
  ChargeRecord charge{info_.tenant, info_.tier,
                      {u.prompt_tokens - u.cached_tokens, u.cached_tokens, u.completion_tokens - u.reasoning_tokens,
                       u.reasoning_tokens}};
  budget_.Charge(std::move(charge),
                 [self = shared_from_this(), e](const Status& charged) { self->Complete(e, charged); });
}

void CompletionSink::Complete(const engine::TokenEvent& e, const Status& charged) {
  info_.reservation.reset();  // the ledger holds the actual charge now
  const auto& u = e.usage;
  exchange_->NoteCompletion({info_.id, info_.tier, u.prompt_tokens, u.cached_tokens, u.completion_tokens,
                             u.reasoning_tokens});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - info_.received).count();

  const bool cancelled = e.finish == engine::FinishReason::kCancelled && !assembler_.StopMatched();
  if (cancelled && disconnected_.load()) {
    metrics_.RequestFinished(499, seconds);  // nginx's "client closed request"
    sse_.Close();
    return;
  }
  if (cancelled || e.finish == engine::FinishReason::kError) {
    // Not the client and not a stop string: the engine failed the sequence
    // (its message is the answer), the daemon is draining, or something else
    // cancelled it, which is a bug and reported as one.
    ApiError err = e.finish == engine::FinishReason::kError && e.unavailable
                       ? ApiError::Unavailable("The serving group lost a rank while generating this completion; retry shortly (" +
                                                   e.error + ")", 5)
                   : e.finish == engine::FinishReason::kError
                       ? ApiError::Internal("The engine failed while generating this completion: " + e.error)
                   : scheduler_.ShuttingDown()
                       ? ApiError::Unavailable("The server is shutting down; the request was cancelled before it finished", 1)
                       : ApiError::Internal("The request was cancelled inside the server before it finished");
    metrics_.RequestFinished(err.status, seconds);
    for (const auto& d : withheld_) SendDelta(d);  // what was made before the failure, then why
    if (info_.stream) AbortStream(err.ToJson());
    else ReplyError(*exchange_, err);
    return;
  }
  if (!charged) {
    // Not on disk, so not charged: the request is not acknowledged either.
    ApiError err = ApiError::Internal("The usage of this completion could not be recorded (" +
                                      charged.error().message() + "); it was not charged");
    metrics_.RequestFinished(err.status, seconds);
    // Neither the withheld end of the answer nor [DONE]: the client does
    // not get a complete answer that was not charged.
    if (info_.stream) AbortStream(err.ToJson(), /*done=*/false);
    else ReplyError(*exchange_, err);
    return;
  }
  const char* finish_reason = "stop";
  if (assembler_.StopMatched()) finish_reason = "stop";
  else if (e.finish == engine::FinishReason::kLength) finish_reason = "length";
  else if (!assembler_.tool_calls().empty()) finish_reason = "tool_calls";
  metrics_.RequestFinished(200, seconds);

  for (const auto& d : withheld_) SendDelta(d);  // charged: the end of the answer goes out
  if (info_.stream) {
    sse_.Send(Chunk(json::object(), finish_reason).dump());
    if (info_.include_usage) {
      json last = {{"id", info_.id},       {"object", "chat.completion.chunk"}, {"created", info_.created},
                   {"model", info_.model}, {"system_fingerprint", nullptr},     {"choices", json::array()},
                   {"usage", Usage(u)},    {"tier", info_.tier}};
      if (info_.downgraded) last["downgraded"] = "budget";
      sse_.Send(last.dump());
    }
    sse_.Send("[DONE]");
    sse_.Close();
    return;
  }
  json message = {{"role", "assistant"}};
  const bool has_calls = !assembler_.tool_calls().empty();
  message["content"] = (has_calls && assembler_.content().empty()) ? json(nullptr) : json(assembler_.content());
  message["reasoning_content"] = assembler_.reasoning().empty() ? json(nullptr) : json(assembler_.reasoning());
  if (has_calls) {
    json calls = json::array();
    for (const auto& c : assembler_.tool_calls()) {
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  json body = {{"id", info_.id},
               {"object", "chat.completion"},
               {"created", info_.created},
               {"model", info_.model},
               {"system_fingerprint", nullptr},
               {"choices", json::array({{{"index", 0},
                                         {"message", std::move(message)},
                                         {"logprobs", info_.logprobs ? LogprobsJson(assembler_.content_logprobs(), info_.logprobs_tokenizer)
                                                                   : json(nullptr)},
                                         {"finish_reason", finish_reason}}})},
               {"usage", Usage(u)},
               {"tier", info_.tier}};
  HttpResponse response{200, "application/json", {}, ""};
  if (info_.downgraded) {
    body["downgraded"] = "budget";
    response.headers.emplace_back("X-MoE-Downgraded", "budget");
  }
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  exchange_->Reply(std::move(response));
}

}  // namespace moeserve::daemon

// The sink of one chat completion: assembles the sequence's tokens
// (the reader its family's dialect made) and answers the client, either once at the end (a JSON
// chat.completion) or as server-sent chat.completion.chunk events.
//
// Every request that reaches the engine is charged once when it ends (to the
// budget service's ledger), for what was computed: completed, cancelled,
// failed or abandoned by its client. Its answer (the JSON body, or the
// stream's last chunks and [DONE]) is sent only after that charge is
// committed; a charge that cannot be committed turns the answer into a 500.
//
// Thread safety: OnEvent runs on the scheduler thread only; the answer after
// the charge runs on the ledger's writer thread, after the last event;
// OnDisconnect may run on any thread and only sets flags and cancels.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/usage/budget_service.hpp"
#include "moeserve/daemon/http/http_exchange.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/completions/scheduler.hpp"
#include "http/sse_writer.hpp"

namespace moeserve::daemon {

struct CompletionInfo {
  std::string id;          // chatcmpl-...
  int64_t created = 0;     // unix seconds
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::string tenant;
  std::string tier;
  bool downgraded = false;  // served at low by a spent `downgrade` budget
  std::vector<std::string> stop;
  uint64_t call_id_seed = 0;  // the seed the server's tool-call ids are drawn from (RenderedTurn::Controller)
  int64_t image_tokens = 0;  // prompt tokens that are image spans (usage.prompt_tokens_details.image_tokens)
  bool logprobs = false;                       // choices[].logprobs for the content tokens
  // The request as its family rendered it: makes the reader of its output.
  std::shared_ptr<const RenderedTurn> turn;
  // How logprobs spell this family's ids (ChatDialect::logprobs_tokenizer); null: bytes.
  const engine::HfTokenizer* logprobs_tokenizer = nullptr;
  std::chrono::steady_clock::time_point received;
  // The request's hold on its tenant's budgets and concurrency: released once
  // its charge is committed, or when the sink goes without one.
  std::shared_ptr<BudgetService::Reservation> reservation;
};

class CompletionSink : public SequenceSink, public std::enable_shared_from_this<CompletionSink> {
 public:
  CompletionSink(CompletionInfo info, std::shared_ptr<HttpExchange> exchange, Scheduler& scheduler,
                 DaemonMetrics& metrics, BudgetService& budget);

  // Streaming: sends the response head, the role chunk and any events that
  // came since Submit.
  void BeginStream();
  // The client hung up (or stopped reading): cancels the sequence, which the
  // engine frees at its next step. Streamed or not.
  void OnDisconnect();
  void SetSequence(engine::SequenceId id);
  // Submit failed after BeginStream: the error goes into the stream.
  // Sends the error; `done` adds [DONE] (never after an uncharged answer).
  void AbortStream(const nlohmann::json& error_body, bool done = true);

  void OnEvent(const engine::TokenEvent& event) override;

 private:
  nlohmann::json Chunk(nlohmann::json delta, const char* finish_reason, nlohmann::json logprobs = nullptr) const;
  nlohmann::json Usage(const engine::SequenceUsage& u) const;
  void SendDelta(const OutputDelta& d);
  void Finish(const engine::TokenEvent& event);
  // The answer, once the charge of `event`'s usage is committed (or not).
  void Complete(const engine::TokenEvent& event, const Status& charged);

  CompletionInfo info_;
  std::shared_ptr<HttpExchange> exchange_;
  Scheduler& scheduler_;
  DaemonMetrics& metrics_;
  BudgetService& budget_;
  std::unique_ptr<OutputReader> reader_;  // this family's output format
  OutputReader& assembler_;
  SseWriter sse_;

  std::mutex id_mu_;
  std::optional<engine::SequenceId> sequence_;
  bool cancel_requested_ = false;  // a disconnect came before the id was known
  bool stop_cancel_sent_ = false;
  std::atomic<bool> disconnected_{false};
  std::optional<std::chrono::steady_clock::time_point> last_token_at_;
  // The finishing event's output (its token and what the reader held back):
  // sent only once the charge is committed, so that a client never holds a
  // whole answer the ledger did not record.
  std::vector<OutputDelta> withheld_;
};

}  // namespace moeserve::daemon

// The sink of one chat completion: assembles the sequence's tokens
// (OutputAssembler) and answers the client, either once at the end (a JSON
// chat.completion) or as server-sent chat.completion.chunk events.
//
// Thread safety: OnEvent runs on the scheduler thread only; OnDisconnect may
// run on any thread and only sets flags and cancels.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/http_exchange.hpp"
#include "moeserve/daemon/metrics.hpp"
#include "moeserve/daemon/output_assembler.hpp"
#include "moeserve/daemon/scheduler.hpp"
#include "sse_writer.hpp"

namespace moeserve::daemon {

struct CompletionInfo {
  std::string id;          // chatcmpl-...
  int64_t created = 0;     // unix seconds
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::string tenant;
  std::string tier;
  std::vector<std::string> stop;
  std::chrono::steady_clock::time_point received;
};

class CompletionSink : public SequenceSink, public std::enable_shared_from_this<CompletionSink> {
 public:
  CompletionSink(CompletionInfo info, std::shared_ptr<HttpExchange> exchange, Scheduler& scheduler,
                 DaemonMetrics& metrics);

  // Streaming: sends the response head, the role chunk and any events that
  // came since Submit.
  void BeginStream();
  // The client hung up (or stopped reading): cancels the sequence, which the
  // engine frees at its next step. Streamed or not.
  void OnDisconnect();
  void SetSequence(engine::SequenceId id);
  // Submit failed after BeginStream: the error goes into the stream.
  void AbortStream(const nlohmann::json& error_body);

  void OnEvent(const engine::TokenEvent& event) override;

 private:
  nlohmann::json Chunk(nlohmann::json delta, const char* finish_reason) const;
  nlohmann::json Usage(const engine::SequenceUsage& u) const;
  void SendDelta(const OutputDelta& d);
  void Finish(const engine::TokenEvent& event);

  CompletionInfo info_;
  std::shared_ptr<HttpExchange> exchange_;
  Scheduler& scheduler_;
  DaemonMetrics& metrics_;
  OutputAssembler assembler_;
  SseWriter sse_;

  std::mutex id_mu_;
  std::optional<engine::SequenceId> sequence_;
  bool cancel_requested_ = false;  // a disconnect came before the id was known
  bool stop_cancel_sent_ = false;
  std::atomic<bool> disconnected_{false};
  std::optional<std::chrono::steady_clock::time_point> last_token_at_;
};

}  // namespace moeserve::daemon

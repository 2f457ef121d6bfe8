// A chat-completions load generator: closed-loop workers, each sending one
// request at a time, their number ramping from `start_concurrency` to
// `peak_concurrency` over `ramp_seconds`, held for `hold_seconds`, then
// stopping (requests in flight finish). Each request goes to the endpoint
// `pick_endpoint` returns at that moment (a Service's view of ready
// replicas), so replicas can come and go under load. Every answer that is
// not 200 with a complete body counts as failed and is kept for the report.
//
// Used by bench_chat_load (a command line) and by e2e tests.
//
// Thread safety: Run blocks the calling thread; `pick_endpoint` and
// `on_progress` are called from worker threads.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace moeserve::bench {

struct ChatLoadOptions {
  std::function<std::string()> pick_endpoint;  // base URL (http://host:port); "" = none ready, wait
  std::string api_key;
  std::string model = "tiny";
  std::string prompt = "Count from one to twenty.";
  int max_tokens = 32;
  int start_concurrency = 1;
  int peak_concurrency = 8;
  double ramp_seconds = 2;
  double hold_seconds = 4;
  double request_timeout_seconds = 60;
};

struct ChatLoadResult {
  uint64_t sent = 0, succeeded = 0, failed = 0;
  std::vector<std::string> failures;  // "<endpoint>: <status or error>: <body head>", first 20
  std::vector<double> latencies_seconds;  // of the successful requests
  double wall_seconds = 0;
};

// Runs the ramp until done or `stop` becomes true.
ChatLoadResult RunChatLoad(const ChatLoadOptions& options, const std::atomic<bool>* stop = nullptr);

}  // namespace moeserve::bench

// Sends the ledger's outbox (usage_ledger.hpp): every pending delivery is
// posted (hook_sender.hpp) until its hook answers 2xx, with exponential
// backoff and jitter between attempts (initial, doubling, capped; each wait
// drawn from [half, all] of that), for `give_up_after_seconds` (at least an
// hour) after the alert fired; then it is marked failed. Deliveries pending
// when the daemon stopped or crashed are in the database and go out after
// it starts again. The body and X-MoE-Delivery id of a delivery never
// change between attempts, so a receiver dedupes by the id.
//
// Counted in moe_alert_deliveries_total{result}: delivered, retry (an
// attempt failed, another is scheduled), refused (an attempt was not made:
// the address or scheme is not allowed; retried, as DNS may change), failed
// (given up, or the hook is no longer configured).
//
// Thread safety: Wake and Stop may be called from any thread; one sender
// thread does the work.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/budget/hook_sender.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"

namespace moeserve::daemon {

struct HookRetryOptions {
  double initial_backoff_seconds = 5;
  double max_backoff_seconds = 600;
  double give_up_after_seconds = 86400;
};

class HookOutbox {
 public:
  // `on_result` (may be empty) is told each attempt's result label.
  HookOutbox(UsageLedger& ledger, HookRetryOptions options, std::function<void(const std::string&)> on_result);
  ~HookOutbox();
  void Start();
  void Stop();
  // Something was queued: look now.
  void Wake();

 private:
  void Loop();
  void Attempt(const OutboxEntry& e);
  double Backoff(int attempts);

  UsageLedger& ledger_;
  HookRetryOptions options_;
  std::function<void(const std::string&)> on_result_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, woken_ = false;
  std::thread thread_;
};

}  // namespace moeserve::daemon

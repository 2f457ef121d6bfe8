#include "moeserve/daemon/usage/hook_outbox.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

HookOutbox::HookOutbox(UsageLedger& ledger, HookRetryOptions options, std::function<void(const std::string&)> on_result)
    : ledger_(ledger), options_(options), on_result_(std::move(on_result)) {}

HookOutbox::~HookOutbox() { Stop(); }

void HookOutbox::Start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
}

void HookOutbox::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HookOutbox::Wake() {
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

double HookOutbox::Backoff(int attempts) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const double full = std::min(options_.max_backoff_seconds,
                               options_.initial_backoff_seconds * std::pow(2.0, std::max(0, attempts - 1)));
  // Jitter: receivers that come back after an outage are not hit by every
  // daemon's retries at the same instant.
  return full * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
}

void HookOutbox::Attempt(const OutboxEntry& e) {
  const auto& hooks = ledger_.policy().hooks;
  auto hook = std::find_if(hooks.begin(), hooks.end(), [&](const HookConfig& h) { return h.name == e.hook; });
  auto report = [&](const char* result) {
    if (on_result_) on_result_(result);
  };
  if (hook == hooks.end()) {
    log::Warn("hooks: delivery " + e.id + " is for hook '" + e.hook + "', which is no longer configured; dropped");
    (void)ledger_.MarkFailed(e.id, "hook no longer configured");
    return report("failed");
  }
  HookSendResult r = SendHook(*hook, e.id, e.body);
  if (r.delivered) {
    if (auto st = ledger_.MarkDelivered(e.id); !st) log::Error("hooks: " + st.error().message());
    return report("delivered");
  }
  const int attempts = e.attempts + 1;
  const double now = ledger_.Now();
  if (now - e.created_at >= options_.give_up_after_seconds) {
    log::Warn("hooks: delivery " + e.id + " given up after " + std::to_string(attempts) + " attempts: " + r.error);
    (void)ledger_.MarkFailed(e.id, r.error);
    return report("failed");
  }
  const double wait = Backoff(attempts);
  log::Warn("hooks: delivery " + e.id + " attempt " + std::to_string(attempts) + " failed (" + r.error +
            "); next in " + std::to_string(wait) + " s");
  if (auto st = ledger_.Reschedule(e.id, attempts, now + wait); !st) log::Error("hooks: " + st.error().message());
  report(r.refused ? "refused" : "retry");
}

void HookOutbox::Loop() {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      woken_ = false;
    }
    auto due = ledger_.DueDeliveries(ledger_.Now(), 32);
    if (!due) log::Error("hooks: " + due.error().message());
    else
      for (const auto& e : *due) {
        {
          std::lock_guard lock(mu_);
          if (stop_) return;
        }
        Attempt(e);
      }
    // Sleep until the next attempt is due (at most a second: the clock the
    // ledger uses may be moved by tests), or until woken.
    double wait = 1.0;
    if (auto next = ledger_.NextDeliveryAt()) wait = std::clamp(*next - ledger_.Now(), 0.0, 1.0);
    if (due && due->size() == 32) wait = 0;
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(wait), [&] { return stop_ || woken_; });
  }
}

}  // namespace moeserve::daemon

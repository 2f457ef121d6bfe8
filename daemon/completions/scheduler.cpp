#include "moeserve/daemon/completions/scheduler.hpp"

#include <chrono>
#include <exception>
#include <set>

#include "moeserve/common/exception_text.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

namespace {

engine::TokenEvent ErrorEvent(engine::SequenceId id, std::string what) {
  engine::TokenEvent e;
  e.id = id;
  e.finish = engine::FinishReason::kError;
  e.error = std::move(what);
  return e;
}

// After a step that threw, before the next: a fault that repeats must not
// spin the loop (and the log) hot.
constexpr auto kBackoffAfterThrow = std::chrono::milliseconds(10);

}  // namespace

void Scheduler::Start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<engine::SequenceId> Scheduler::Submit(engine::GenerationRequest request, std::shared_ptr<SequenceSink> sink) {
  engine::SequenceId id;
  {
    // Submit and registration under one lock: the loop routes a step's
    // events only after taking this lock, so it never sees an id it cannot route.
    std::lock_guard lock(mu_);
    try {
      auto r = engine_.Submit(std::move(request));
      if (!r) return Fail(r.error());
      id = *r;
    } catch (...) {
      return Fail(Error::Internal("submitting the sequence to the engine failed: " + ExceptionText(std::current_exception())));
    }
    try {
      sinks_.emplace(id, std::move(sink));
    } catch (...) {
      engine_.Cancel(id);  // queued but unroutable: let the engine drop it
      return Fail(Error::Internal("registering the sequence failed: " + ExceptionText(std::current_exception())));
    }
    wake_ = true;
  }
  cv_.notify_all();
  return id;
}

void Scheduler::Cancel(engine::SequenceId id) {
  engine_.Cancel(id);
  {
    std::lock_guard lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Scheduler::CancelAll() {
  shutting_down_.store(true);
  std::vector<engine::SequenceId> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, sink] : sinks_) ids.push_back(id);
  }
  for (auto id : ids) Cancel(id);
}

size_t Scheduler::InFlight() const {
  std::lock_guard lock(mu_);
  return sinks_.size();
}

uint64_t Scheduler::steps() const {
  std::lock_guard lock(mu_);
  return steps_;
}

std::vector<engine::TokenEvent> Scheduler::FailInFlight(const std::string& what) {
  log::Error("scheduler: " + what + "; failing every sequence in flight");
  std::vector<engine::TokenEvent> events;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, sink] : sinks_) events.push_back(ErrorEvent(id, what));
  }
  for (const auto& e : events) {
    try {
      engine_.Cancel(e.id);
    } catch (...) {
      log::Error("scheduler: cancelling sequence " + std::to_string(e.id) + " failed: " + ExceptionText(std::current_exception()));
    }
  }
  return events;
}

void Scheduler::Deliver(std::vector<std::pair<std::shared_ptr<SequenceSink>, const engine::TokenEvent*>>& routed) {
  std::set<const SequenceSink*> cut;  // sinks that threw this round: no more events for them
  for (auto& [sink, e] : routed) {
    if (cut.count(sink.get())) continue;
    std::string what;
    try {
      sink->OnEvent(*e);
      continue;
    } catch (...) {
      what = ExceptionText(std::current_exception());
    }
    log::Error("scheduler: the sink of sequence " + std::to_string(e->id) + " threw: " + what);
    if (e->finish != engine::FinishReason::kNone) continue;  // that was its last event anyway
    cut.insert(sink.get());
    {
      std::lock_guard lock(mu_);
      auto it = sinks_.find(e->id);
      if (it != sinks_.end() && it->second == sink) sinks_.erase(it);
    }
    try {
      engine_.Cancel(e->id);
    } catch (...) {
      log::Error("scheduler: cancelling sequence " + std::to_string(e->id) + " failed: " + ExceptionText(std::current_exception()));
    }
    // One last event so that the sink can still answer its client.
    try {
      sink->OnEvent(ErrorEvent(e->id, "writing the response failed: " + what));
    } catch (...) {
      log::Error("scheduler: the sink of sequence " + std::to_string(e->id) + " threw again on its error: " +
                 ExceptionText(std::current_exception()));
    }
  }
}

void Scheduler::Loop() {
  auto has_work = [this] {
    try {
      return engine_.HasWork();
    } catch (...) {
      log::Error("scheduler: HasWork threw: " + ExceptionText(std::current_exception()));
      return false;
    }
  };
  // An idle loop wakes this often for the engine's housekeeping
  // (MaintainIdle: prefix files past their max age are deleted on time, not
  // at the next prompt).
  constexpr auto kIdleMaintenance = std::chrono::seconds(1);
  while (true) {
    {
      std::unique_lock lock(mu_);
      const bool news = cv_.wait_for(lock, kIdleMaintenance, [&] { return stop_ || wake_ || has_work(); });
      if (stop_) return;
      if (!news) {
        lock.unlock();
        try {
          engine_.MaintainIdle();
        } catch (...) {
          log::Error("scheduler: idle maintenance threw: " + ExceptionText(std::current_exception()));
        }
        continue;
      }
      wake_ = false;
    }
    std::vector<engine::TokenEvent> events;
    bool threw = false;
    try {
      events = engine_.Step();
    } catch (...) {
      threw = true;
      events = FailInFlight("the engine step threw: " + ExceptionText(std::current_exception()));
    }
    std::vector<std::pair<std::shared_ptr<SequenceSink>, const engine::TokenEvent*>> routed;
    routed.reserve(events.size());
    {
      std::lock_guard lock(mu_);
      ++steps_;
      for (const auto& e : events) {
        auto it = sinks_.find(e.id);
        if (it == sinks_.end()) continue;
        routed.emplace_back(it->second, &e);
        if (e.finish != engine::FinishReason::kNone) sinks_.erase(it);
      }
    }
    // Sinks run outside the lock: they write to sockets and may call Cancel.
    Deliver(routed);
    if (threw) std::this_thread::sleep_for(kBackoffAfterThrow);
  }
}

}  // namespace moeserve::daemon

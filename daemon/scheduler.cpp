#include "moeserve/daemon/scheduler.hpp"

#include <vector>

#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

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
    auto r = engine_.Submit(std::move(request));
    if (!r) return Fail(r.error());
    id = *r;
    sinks_.emplace(id, std::move(sink));
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

void Scheduler::Loop() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || wake_ || engine_.HasWork(); });
      if (stop_) return;
      wake_ = false;
    }
    std::vector<engine::TokenEvent> events = engine_.Step();
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
    for (auto& [sink, e] : routed) {
      try {
        sink->OnEvent(*e);
      } catch (const std::exception& ex) {
        log::Error(std::string("scheduler: a sequence sink threw: ") + ex.what());
      }
    }
  }
}

}  // namespace moeserve::daemon

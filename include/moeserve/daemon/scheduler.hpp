// The scheduler loop: one thread that calls Engine::Step() while there is
// work and hands each sequence's events to its sink.
//
// The Engine does the batching (new sequences join the running batch at the
// next step, finished ones leave, prefill is chunked); this class owns the
// thread, the routing of events, and the wake-ups: Submit and Cancel wake the
// loop, and it sleeps when the engine has nothing to do.
//
// A sink sees its sequence's events in order, on the loop thread, never
// concurrently; the event with `finish != kNone` is the last one. A sink may
// call Cancel() from OnEvent (stop strings, a failed write): the engine drops
// the sequence at the next step, so a disconnected client costs at most one
// more step.
//
// Thread safety: Submit, Cancel, InFlight, CancelAll may be called from any
// thread; Start/Stop from the owner.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::daemon {

class SequenceSink {
 public:
  virtual ~SequenceSink() = default;
  virtual void OnEvent(const engine::TokenEvent& event) = 0;
};

class Scheduler {
 public:
  explicit Scheduler(engine::Engine& engine) : engine_(engine) {}
  ~Scheduler() { Stop(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void Start();
  // Stops the loop after the current step; sequences still in flight get no
  // more events (call CancelAll and wait for InFlight() == 0 first).
  void Stop();

  // Errors are Engine::Submit's (kInvalidArgument, kResourceExhausted).
  Result<engine::SequenceId> Submit(engine::GenerationRequest request, std::shared_ptr<SequenceSink> sink);
  void Cancel(engine::SequenceId id);
  void CancelAll();
  size_t InFlight() const;
  uint64_t steps() const;

 private:
  void Loop();

  engine::Engine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
  uint64_t steps_ = 0;
  std::unordered_map<engine::SequenceId, std::shared_ptr<SequenceSink>> sinks_;
  std::thread thread_;
};

}  // namespace moeserve::daemon

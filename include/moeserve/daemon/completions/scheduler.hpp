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
// No exception crosses into the loop. Engine::Step reports failures as
// kError events; if a step throws anyway (a wrapped engine, a bug), every
// sequence in flight gets a kError event with the exception's message and is
// cancelled in the engine, and the loop serves the next request. A sink that
// throws has its sequence cancelled and gets one last kError event (so it
// can still answer its client); a throwing Submit is an Error::Internal.
// kCancelled reaches a sink when it (or its client) asked, or when CancelAll
// drains the daemon: ShuttingDown() tells which.
//
// Thread safety: Submit, Cancel, InFlight, CancelAll may be called from any
// thread; Start/Stop from the owner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

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
  // engine::Engine in the daemon; tests hand in a wrapper that injects faults.
  explicit Scheduler(engine::StepEngine& engine) : engine_(engine) {}
  ~Scheduler() { Stop(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void Start();
  // Stops the loop after the current step; sequences still in flight get no
  // more events (call CancelAll and wait for InFlight() == 0 first). A step
  // in which every sequence waits for the vision tower sleeps in the engine
  // until the tower answers or a Cancel arrives: CancelAll ends it at once.
  void Stop();

  // Errors are Engine::Submit's (kInvalidArgument, kResourceExhausted), or
  // kInternal when it threw.
  Result<engine::SequenceId> Submit(engine::GenerationRequest request, std::shared_ptr<SequenceSink> sink);
  void Cancel(engine::SequenceId id);
  // Cancels everything in flight because the daemon is shutting down; from
  // then on ShuttingDown() is true.
  void CancelAll();
  bool ShuttingDown() const { return shutting_down_.load(); }
  size_t InFlight() const;
  uint64_t steps() const;

 private:
  void Loop();
  // A step threw: fail every routed sequence (events for their sinks) and
  // cancel them in the engine so that it frees them.
  std::vector<engine::TokenEvent> FailInFlight(const std::string& what);
  // Hands the events to their sinks; a sink that throws is cut off (see above).
  void Deliver(std::vector<std::pair<std::shared_ptr<SequenceSink>, const engine::TokenEvent*>>& routed);

  engine::StepEngine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool wake_ = false;
  std::atomic<bool> shutting_down_{false};
  uint64_t steps_ = 0;
  std::unordered_map<engine::SequenceId, std::shared_ptr<SequenceSink>> sinks_;
  std::thread thread_;
};

}  // namespace moeserve::daemon

// The scheduler loop never lets an exception through: a step that throws
// fails the requests in flight with the exception's message, a sink that
// throws is cut off with a last error event and its sequence cancelled, an
// engine error reaches its sink as kError with the engine's message, and in
// every case the loop goes on to serve the next request. A real engine on a
// generated tiny model; faults come through real seams (the StepEngine the
// loop takes, a decode controller, a sink).
#include "moeserve/daemon/completions/scheduler.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"
#include "daemon_harness.hpp"

namespace moeserve::daemon {
namespace {

using engine::FinishReason;
using engine::TokenEvent;

const engine::ModelDir& TinyModel() {
  static engine::ModelDir dir = [] {
    auto m = engine::OpenModelDir(testing::TinyModelDir());
    if (!m) ADD_FAILURE() << m.error().ToString();
    return std::move(*m);
  }();
  return dir;
}

std::unique_ptr<engine::Engine> MakeEngine() {
  engine::EngineOptions o;
  o.cache_tokens = 2048;
  o.prefix_cache = false;  // every block in use belongs to a live sequence
  auto e = engine::Engine::Create(TinyModel(), o);
  EXPECT_TRUE(e) << e.error().ToString();
  return std::move(*e);
}

engine::GenerationRequest Request(int max_tokens, uint64_t seed = 1) {
  engine::GenerationRequest r;
  r.prompt = {256, 258, 72, 105, 33, 263};
  r.max_tokens = max_tokens;
  r.sampling.seed = seed;
  r.stop_tokens = {-1};  // run to max_tokens
  return r;
}

// A real engine whose next Step throws when armed: what a library failure
// inside a step (an allocation, a device error) looks like to the loop.
class FaultInjectingEngine : public engine::StepEngine {
 public:
  explicit FaultInjectingEngine(engine::Engine& real) : real_(real) {}
  Result<engine::SequenceId> Submit(engine::GenerationRequest r) override { return real_.Submit(std::move(r)); }
  void Cancel(engine::SequenceId id) override { real_.Cancel(id); }
  bool HasWork() const override { return real_.HasWork(); }
  std::vector<TokenEvent> Step() override {
    if (throw_next_step.exchange(false)) throw std::runtime_error("cudaMemcpyAsync: an illegal memory access was encountered");
    return real_.Step();
  }
  std::atomic<bool> throw_next_step{false};

 private:
  engine::Engine& real_;
};

class Recorder : public SequenceSink {
 public:
  void OnEvent(const TokenEvent& e) override {
    int tokens;
    {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      if (e.token >= 0) ++tokens_;
      tokens = tokens_;
      if (e.finish != FinishReason::kNone) ++finishes_;
    }
    cv_.notify_all();
    if (on_token && e.token >= 0) on_token(tokens);
  }
  // Waits for a finishing event; false on timeout.
  bool WaitFinished(std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return finishes_ > 0; });
  }
  std::vector<TokenEvent> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  TokenEvent last() {
    std::lock_guard lock(mu_);
    return events_.empty() ? TokenEvent{} : events_.back();
  }
  int finishes() {
    std::lock_guard lock(mu_);
    return finishes_;
  }
  std::function<void(int tokens_so_far)> on_token;  // runs on the loop thread, may throw

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> events_;
  int tokens_ = 0;
  int finishes_ = 0;
};

bool WaitFor(const std::function<bool()>& pred, std::chrono::seconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// The next request after a fault: served in full.
void ExpectServes(Scheduler& s, int max_tokens = 6) {
  auto sink = std::make_shared<Recorder>();
  auto id = s.Submit(Request(max_tokens, 9), sink);
  ASSERT_TRUE(id) << id.error().ToString();
  ASSERT_TRUE(sink->WaitFinished()) << "the loop no longer serves requests";
  EXPECT_EQ(sink->last().finish, FinishReason::kLength) << sink->last().error;
  EXPECT_EQ(static_cast<int>(sink->events().size()), max_tokens);
}

TEST(SchedulerFaults, StepThatThrowsFailsItsRequestsAndTheLoopGoesOn) {
  auto real = MakeEngine();
  FaultInjectingEngine faulty(*real);
  Scheduler s(faulty);
  s.Start();
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  a->on_token = [&](int n) {
    if (n == 2) faulty.throw_next_step = true;
  };
  ASSERT_TRUE(s.Submit(Request(200), a));
  ASSERT_TRUE(s.Submit(Request(200, 2), b));
  ASSERT_TRUE(a->WaitFinished());
  ASSERT_TRUE(b->WaitFinished());
  for (auto* r : {a.get(), b.get()}) {
    const TokenEvent last = r->last();
    EXPECT_EQ(last.finish, FinishReason::kError);
    EXPECT_NE(last.error.find("the engine step threw: cudaMemcpyAsync: an illegal memory access"), std::string::npos)
        << last.error;
    EXPECT_EQ(r->finishes(), 1);
  }
  EXPECT_FALSE(s.ShuttingDown());
  EXPECT_EQ(s.InFlight(), 0u);
  // The engine was told to drop both sequences and frees their blocks.
  EXPECT_TRUE(WaitFor([&] { return !real->HasWork() && real->Metrics().cache_usage_ratio == 0.0; }));
  ExpectServes(s);
  s.Stop();
}

// Throws from OnToken once it has seen `after` tokens.
class ThrowingController : public engine::DecodeController {
 public:
  std::vector<int> OnToken(int) override {
    if (++seen_ == 3) throw std::out_of_range("tool schema: key 'properties' not found");
    return {};
  }

 private:
  int seen_ = 0;
};

TEST(SchedulerFaults, EngineErrorReachesItsSinkAsAnError) {
  auto real = MakeEngine();
  Scheduler s(*real);
  s.Start();
  auto sink = std::make_shared<Recorder>();
  auto req = Request(50);
  req.controller = std::make_shared<ThrowingController>();
  ASSERT_TRUE(s.Submit(std::move(req), sink));
  ASSERT_TRUE(sink->WaitFinished());
  const TokenEvent last = sink->last();
  EXPECT_EQ(last.finish, FinishReason::kError) << "an engine failure must not look like a cancel";
  EXPECT_NE(last.error.find("tool schema: key 'properties' not found"), std::string::npos) << last.error;
  EXPECT_FALSE(s.ShuttingDown());
  ExpectServes(s);
  s.Stop();
}

TEST(SchedulerFaults, SinkThatThrowsIsCutOffAndItsSequenceCancelled) {
  auto real = MakeEngine();
  Scheduler s(*real);
  s.Start();
  auto sink = std::make_shared<Recorder>();
  sink->on_token = [](int n) {
    if (n == 2) throw std::system_error(std::make_error_code(std::errc::broken_pipe), "writing the SSE chunk");
  };
  ASSERT_TRUE(s.Submit(Request(200), sink));
  ASSERT_TRUE(sink->WaitFinished());
  EXPECT_TRUE(WaitFor([&] { return s.InFlight() == 0 && !real->HasWork(); }));
  const auto events = sink->events();
  ASSERT_EQ(events.size(), 3u) << "events kept coming after the sink threw";
  EXPECT_EQ(events[2].finish, FinishReason::kError);
  EXPECT_NE(events[2].error.find("writing the response failed: writing the SSE chunk"), std::string::npos) << events[2].error;
  EXPECT_EQ(real->Metrics().cache_usage_ratio, 0.0) << "the cut-off sequence still holds its cache";
  ExpectServes(s);
  s.Stop();
}

TEST(SchedulerFaults, OnlyCancelAllMeansShuttingDown) {
  auto real = MakeEngine();
  Scheduler s(*real);
  s.Start();
  auto mine = std::make_shared<Recorder>();
  auto id = s.Submit(Request(500), mine);
  ASSERT_TRUE(id);
  s.Cancel(*id);  // as a stop string or a vanished client does
  ASSERT_TRUE(mine->WaitFinished());
  EXPECT_EQ(mine->last().finish, FinishReason::kCancelled);
  EXPECT_FALSE(s.ShuttingDown());
  auto drained = std::make_shared<Recorder>();
  ASSERT_TRUE(s.Submit(Request(500), drained));
  s.CancelAll();
  ASSERT_TRUE(drained->WaitFinished());
  EXPECT_EQ(drained->last().finish, FinishReason::kCancelled);
  EXPECT_TRUE(s.ShuttingDown());
  s.Stop();
}

// The .mpc files under a prefix disk tier's directory (its model folder).
int PrefixFiles(const std::string& dir) {
  int n = 0;
  if (!std::filesystem::exists(dir)) return 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().extension() == ".mpc") ++n;
  return n;
}

// An idle loop still runs the engine's housekeeping: a prefix file past its
// max age is deleted with no request arriving (before, only the next prompt
// that touched the tier deleted it, so an idle node kept a tenant's cached
// prompt past the bound the operator set).
TEST(SchedulerIdle, APrefixFilePastItsMaxAgeIsDeletedWithoutARequest) {
  const std::string dir = ::testing::TempDir() + "/scheduler_idle_disk_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  engine::EngineOptions o;
  o.cache_tokens = 2048;
  o.prefix_disk_dir = dir;
  {  // one prompt's prefix, left on disk when its engine goes
    auto e = engine::Engine::Create(TinyModel(), o);
    ASSERT_TRUE(e) << e.error().ToString();
    engine::GenerationRequest r = Request(1);
    r.prompt.clear();
    for (int i = 0; i < 70; ++i) r.prompt.push_back(100 + i % 50);
    ASSERT_TRUE((*e)->Submit(std::move(r)));
    for (int guard = 0; (*e)->HasWork() && guard < 1000; ++guard) (*e)->Step();
  }
  ASSERT_GE(PrefixFiles(dir), 1) << "the prefix was not written to " << dir;
  o.prefix_disk_max_age_seconds = 1;
  auto e = engine::Engine::Create(TinyModel(), o);
  ASSERT_TRUE(e) << e.error().ToString();
  ASSERT_GE(PrefixFiles(dir), 1) << "a file written just now must not be expired at start";
  Scheduler s(**e);
  s.Start();
  for (int i = 0; i < 100 && PrefixFiles(dir) > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(PrefixFiles(dir), 0) << "an idle daemon kept a prefix file past its max age";
  EXPECT_GE((*e)->Metrics().prefix_cache.disk_expired, 1u);
  s.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon

// The vision tower runs on its own thread (engine/image_embedder.hpp): while
// one sequence's image is embedded the others keep decoding, a sequence's
// tokens do not depend on when its image's rows come back, and cancelling a
// sequence or destroying the engine mid-embedding drops its jobs cleanly.
//
// The model is the real tiny vision model with a gate in front of its tower
// (GatedTower): EmbedImage waits until the test opens the gate, so "the image
// is being embedded" lasts exactly as long as the test needs. Everything
// else, the tower's own computation included, is the real model's.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;
using namespace std::chrono_literals;

// What the test and the gated tower share.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int calls = 0;                  // EmbedImage calls begun
  bool ran_on_step_thread = false;  // a call came from the thread that calls Step
  // Set: the tower fails with this message instead of embedding (throws it
  // with `throws`).
  std::string fail_with;
  bool throws = false;
  std::thread::id step_thread = std::this_thread::get_id();

  void Open() {
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  }
  // True once `n` calls have begun.
  bool WaitCalls(int n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 30s, [&] { return calls >= n; });
  }
  int Calls() {
    std::lock_guard lock(mu);
    return calls;
  }
  bool RanOnStepThread() {
    std::lock_guard lock(mu);
    return ran_on_step_thread;
  }
};

class GatedTower : public FamilyModel {
 public:
  GatedTower(std::unique_ptr<FamilyModel> real, std::shared_ptr<Gate> gate) : real_(std::move(real)), gate_(std::move(gate)) {}
  int vocab_size() const override { return real_->vocab_size(); }
  int64_t max_position() const override { return real_->max_position(); }
  size_t cache_floats_per_token() const override { return real_->cache_floats_per_token(); }
  SequenceCache NewSequence() const override { return real_->NewSequence(); }
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                 std::vector<std::vector<uint64_t>>* expert_tokens) const override {
    return real_->Forward(pool, segments, logits, trace, expert_tokens);
  }
  std::vector<int> ExpertCounts() const override { return real_->ExpertCounts(); }
  int idle_prefill_rows() const override { return real_->idle_prefill_rows(); }
  void Retire(const SequenceCache& cache) const override { real_->Retire(cache); }
  const VisionConfig* vision() const override { return real_->vision(); }
  Result<std::vector<float>> EmbedImage(const ImageInput& image) const override {
    {
      std::unique_lock lock(gate_->mu);
      ++gate_->calls;
      gate_->cv.notify_all();
      // On the step thread the gate would block the test itself: note it
      // (the test fails on it) and go on.
      if (std::this_thread::get_id() == gate_->step_thread)
        gate_->ran_on_step_thread = true;
      else
        gate_->cv.wait(lock, [&] { return gate_->open; });
      if (!gate_->fail_with.empty()) {
        if (gate_->throws) throw std::runtime_error(gate_->fail_with);
        return Fail(Error::Io(gate_->fail_with));
      }
    }
    return real_->EmbedImage(image);
  }

 private:
  std::unique_ptr<FamilyModel> real_;
  std::shared_ptr<Gate> gate_;
};

std::unique_ptr<Engine> MakeGated(const EngineOptions& o, std::shared_ptr<Gate> gate) {
  const std::string& dir = TinyVisionModel();
  auto family = FindFamily(dir);
  EXPECT_TRUE(family) << family.error().ToString();
  if (!family) return nullptr;
  auto parts = (*family)->load(dir, ModelOptionsFor(o));
  EXPECT_TRUE(parts) << parts.error().ToString();
  if (!parts) return nullptr;
  parts->model = std::make_unique<GatedTower>(std::move(parts->model), std::move(gate));
  auto e = Engine::Create(std::move(*parts), o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

std::unique_ptr<Engine> MakePlain(const EngineOptions& o) {
  auto e = Engine::Open(TinyVisionModel(), o);
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? std::move(*e) : nullptr;
}

const VisionConfig& Vision() {
  static const VisionConfig v = *OpenModelDir(TinyVisionModel())->config.vision;
  return v;
}

// Text only; never stops before max_tokens (no stop token can be sampled).
GenerationRequest TextRequest(int max_tokens) {
  GenerationRequest r;
  r.prompt = {256, 259, 104, 101, 108, 108, 111, 262, 260, 263};
  r.max_tokens = max_tokens;
  r.stop_tokens = {-1};
  r.sampling.temperature = 0;
  r.logprobs = 0;
  return r;
}

// <|bos|><|user|> "see" [image] "now" <|end|><|assistant|><|think|>: text
// before the image, so that a chunk runs up to it while the tower works.
GenerationRequest ImageRequest(const ImageInput& image) {
  GenerationRequest r;
  r.prompt = {256, 259, 115, 101, 101};
  EXPECT_TRUE(AppendImage(Vision(), image, r.prompt, r.images));
  for (int t : {110, 111, 119, 262, 260, 263}) r.prompt.push_back(t);
  r.max_tokens = 6;
  r.stop_tokens = {-1};
  r.sampling.temperature = 0;
  r.logprobs = 0;
  return r;
}

struct Outcome {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

void Record(std::map<SequenceId, Outcome>& out, const std::vector<TokenEvent>& events) {
  for (const TokenEvent& ev : events) {
    Outcome& o = out[ev.id];
    if (ev.token >= 0) {
      o.tokens.push_back(ev.token);
      if (ev.logprob) o.logprobs.push_back(*ev.logprob);
    }
    if (ev.finish != FinishReason::kNone) o.finish = ev.finish, o.error = ev.error;
  }
}

void Drain(Engine& e, std::map<SequenceId, Outcome>& out) {
  for (int guard = 0; e.HasWork() && guard < 10000; ++guard) Record(out, e.Step());
  EXPECT_FALSE(e.HasWork());
}

Outcome Alone(Engine& e, GenerationRequest r) {
  auto id = e.Submit(std::move(r));
  EXPECT_TRUE(id) << id.error().ToString();
  std::map<SequenceId, Outcome> out;
  if (id) Drain(e, out);
  return id ? out[*id] : Outcome{};
}

int TokensFor(const std::vector<TokenEvent>& events, SequenceId id) {
  int n = 0;
  for (const TokenEvent& ev : events) n += ev.id == id && ev.token >= 0;
  return n;
}

// A decodes; B's image is held in the tower. Every step gives A its token
// and B none; once the tower answers, B finishes. Returns A's and B's outcomes.
std::pair<Outcome, Outcome> DecodeBesideAHeldImage(const EngineOptions& o, const ImageInput& image) {
  auto gate = std::make_shared<Gate>();
  auto e = MakeGated(o, gate);
  if (!e) return {};
  std::map<SequenceId, Outcome> out;
  auto a = e->Submit(TextRequest(16));
  EXPECT_TRUE(a);
  for (int guard = 0; out[*a].tokens.empty() && guard < 100; ++guard) Record(out, e->Step());
  EXPECT_EQ(out[*a].tokens.size(), 1u);
  auto b = e->Submit(ImageRequest(image));
  EXPECT_TRUE(b);
  std::vector<TokenEvent> events = e->Step();  // admits B and queues its image
  Record(out, events);
  EXPECT_EQ(TokensFor(events, *a), 1);
  EXPECT_FALSE(gate->RanOnStepThread()) << "the tower ran on the step thread";
  EXPECT_TRUE(gate->WaitCalls(1)) << "the tower never started on B's image";
  for (int step = 0; step < 5; ++step) {
    events = e->Step();
    Record(out, events);
    EXPECT_EQ(TokensFor(events, *a), 1) << "step " << step << ": A waited for B's image";
    EXPECT_EQ(TokensFor(events, *b), 0) << "step " << step << ": B ran before its image's rows came back";
  }
  gate->Open();
  Drain(*e, out);
  EXPECT_FALSE(gate->RanOnStepThread());
  EXPECT_EQ(gate->Calls(), 1);
  return {out[*a], out[*b]};
}

TEST(VisionTowerThread, DecodeGoesOnWhileAnImageIsEmbedded) {
  EngineOptions o;
  o.prefix_cache = false;
  const ImageInput image = Pattern(90, 60, 2);
  auto [a, b] = DecodeBesideAHeldImage(o, image);
  EXPECT_EQ(a.finish, FinishReason::kLength) << a.error;
  ASSERT_EQ(b.finish, FinishReason::kLength) << b.error;
  // B answers as it does alone (model.md 10: batch composition moves the
  // logits by rounding only).
  auto plain = MakePlain(o);
  ASSERT_TRUE(plain);
  const Outcome want = Alone(*plain, ImageRequest(image));
  ASSERT_EQ(want.finish, FinishReason::kLength) << want.error;
  EXPECT_EQ(b.tokens, want.tokens);
  ASSERT_EQ(b.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < want.logprobs.size(); ++i) EXPECT_NEAR(b.logprobs[i], want.logprobs[i], 1e-4) << i;
}

// With deterministic decode, when the tower answers changes nothing: B's and
// A's log-probabilities are the same bits as each alone.
TEST(VisionTowerThread, DeterministicResultsDoNotDependOnTheTowersTiming) {
  EngineOptions o;
  o.prefix_cache = false;
  o.deterministic = true;
  const ImageInput image = Pattern(90, 60, 2);
  auto [a, b] = DecodeBesideAHeldImage(o, image);
  ASSERT_EQ(a.finish, FinishReason::kLength) << a.error;
  ASSERT_EQ(b.finish, FinishReason::kLength) << b.error;
  auto plain = MakePlain(o);
  ASSERT_TRUE(plain);
  const Outcome want_b = Alone(*plain, ImageRequest(image));
  const Outcome want_a = Alone(*plain, TextRequest(16));
  EXPECT_EQ(b.tokens, want_b.tokens);
  EXPECT_EQ(b.logprobs, want_b.logprobs);
  EXPECT_EQ(a.tokens, want_a.tokens);
  EXPECT_EQ(a.logprobs, want_a.logprobs);
}

// B1's image is in the tower, B2's queued behind it. Cancelling both frees
// them at the next step; B2's image is never embedded; the engine then
// serves another image request as a fresh engine does.
TEST(VisionTowerThread, CancellingQueuedAndRunningImagesFreesThem) {
  EngineOptions o;
  o.prefix_cache = false;
  auto gate = std::make_shared<Gate>();
  auto e = MakeGated(o, gate);
  ASSERT_TRUE(e);
  auto b1 = e->Submit(ImageRequest(Pattern(90, 60, 2)));
  auto b2 = e->Submit(ImageRequest(Pattern(64, 64, 3)));
  ASSERT_TRUE(b1 && b2);
  std::map<SequenceId, Outcome> out;
  Record(out, e->Step());  // admits both, queues both images, prefills up to them
  ASSERT_FALSE(gate->RanOnStepThread()) << "the tower ran on the step thread";
  ASSERT_TRUE(gate->WaitCalls(1));
  EXPECT_EQ(e->Metrics().running, 2);
  EXPECT_GT(e->Metrics().cache_usage_ratio, 0.0);
  e->Cancel(*b1);
  e->Cancel(*b2);
  Record(out, e->Step());
  EXPECT_EQ(out[*b1].finish, FinishReason::kCancelled);
  EXPECT_EQ(out[*b2].finish, FinishReason::kCancelled);
  EXPECT_FALSE(e->HasWork());
  EXPECT_EQ(e->Metrics().running, 0);
  EXPECT_EQ(e->Metrics().cache_usage_ratio, 0.0) << "the cancelled sequences' blocks are free";

  gate->Open();  // B1's embedding comes back to nobody
  const ImageInput image = Pattern(40, 30, 7);
  const Outcome got = Alone(*e, ImageRequest(image));
  ASSERT_EQ(got.finish, FinishReason::kLength) << got.error;
  EXPECT_EQ(gate->Calls(), 2) << "B2's queued image was embedded after its sequence was cancelled";
  auto plain = MakePlain(o);
  ASSERT_TRUE(plain);
  const Outcome want = Alone(*plain, ImageRequest(image));
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < want.logprobs.size(); ++i) EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4) << i;
}

// With nothing to run but a sequence waiting for its image, Step sleeps
// instead of returning at once (a caller's `while (HasWork()) Step()` would
// spin a core against the tower), and wakes when the tower answers or a
// Cancel arrives.
TEST(VisionTowerThread, AStepWithOnlyTowerWorkSleepsUntilTheTowerOrACancel) {
  EngineOptions o;
  o.prefix_cache = false;
  auto gate = std::make_shared<Gate>();
  auto e = MakeGated(o, gate);
  ASSERT_TRUE(e);
  std::atomic<int> steps{0};
  std::map<SequenceId, Outcome> out;
  auto drive = [&] {
    while (e->HasWork()) {
      Record(out, e->Step());
      ++steps;
    }
  };
  auto b = e->Submit(ImageRequest(Pattern(90, 60, 2)));
  ASSERT_TRUE(b);
  gate->step_thread = std::thread::id();  // Step runs on `driver`; the gate holds every tower call
  std::thread driver(drive);
  ASSERT_TRUE(gate->WaitCalls(1));
  std::this_thread::sleep_for(200ms);  // time for a spinning loop to show itself
  // One step admits B and prefills up to the image; the next sleeps.
  EXPECT_LE(steps.load(), 2) << "Step returned again and again while only the tower had work";
  gate->Open();
  driver.join();  // hangs (the test's timeout) if the tower's answer never woke the step
  EXPECT_EQ(out[*b].finish, FinishReason::kLength) << out[*b].error;

  // Now a cancel is what wakes it.
  auto gate2 = std::make_shared<Gate>();
  gate2->step_thread = std::thread::id();
  auto e2 = MakeGated(o, gate2);
  ASSERT_TRUE(e2);
  e.swap(e2);
  auto c = e->Submit(ImageRequest(Pattern(64, 64, 3)));
  ASSERT_TRUE(c);
  std::thread driver2(drive);
  ASSERT_TRUE(gate2->WaitCalls(1));
  e->Cancel(*c);
  driver2.join();
  EXPECT_EQ(out[*c].finish, FinishReason::kCancelled);
  gate2->Open();  // the tower's running call returns to nobody
}

// A tower that fails (an error, or an exception) fails only its own
// sequence, with the tower's message; the sequence decoding beside it goes on.
TEST(VisionTowerThread, ATowerFailureFailsOnlyItsSequence) {
  for (bool throws : {false, true}) {
    SCOPED_TRACE(throws ? "the tower throws" : "the tower returns an error");
    EngineOptions o;
    o.prefix_cache = false;
    auto gate = std::make_shared<Gate>();
    gate->open = true;
    gate->fail_with = "pixels unreadable";
    gate->throws = throws;
    auto e = MakeGated(o, gate);
    ASSERT_TRUE(e);
    std::map<SequenceId, Outcome> out;
    auto a = e->Submit(TextRequest(8));
    ASSERT_TRUE(a);
    Record(out, e->Step());
    auto b = e->Submit(ImageRequest(Pattern(90, 60, 2)));
    ASSERT_TRUE(b);
    Drain(*e, out);
    EXPECT_EQ(out[*b].finish, FinishReason::kError);
    EXPECT_EQ(out[*b].error.rfind("the vision tower failed: ", 0), 0u) << out[*b].error;
    EXPECT_NE(out[*b].error.find("pixels unreadable"), std::string::npos) << out[*b].error;
    EXPECT_EQ(out[*a].finish, FinishReason::kLength) << out[*a].error;
    EXPECT_EQ(out[*a].tokens.size(), 8u);
    EXPECT_EQ(e->Metrics().cache_usage_ratio, 0.0);
  }
}

// Destroying the engine while its tower holds one image and has another
// queued: the destructor waits for the running embedding only, never runs
// the queued one, and returns.
TEST(VisionTowerThread, DestroyingTheEngineMidEmbeddingStopsTheTower) {
  EngineOptions o;
  o.prefix_cache = false;
  auto gate = std::make_shared<Gate>();
  auto e = MakeGated(o, gate);
  ASSERT_TRUE(e);
  ASSERT_TRUE(e->Submit(ImageRequest(Pattern(90, 60, 2))));
  ASSERT_TRUE(e->Submit(ImageRequest(Pattern(64, 64, 3))));
  e->Step();
  ASSERT_FALSE(gate->RanOnStepThread()) << "the tower ran on the step thread";
  ASSERT_TRUE(gate->WaitCalls(1));
  // The running embedding can only end once the gate opens: open it from
  // another thread after the destructor has begun waiting for it.
  std::thread opener([gate] {
    std::this_thread::sleep_for(500ms);
    gate->Open();
  });
  e.reset();
  opener.join();
  EXPECT_EQ(gate->Calls(), 1) << "the queued image was embedded while the engine was being destroyed";
}

}  // namespace
}  // namespace moeserve::engine

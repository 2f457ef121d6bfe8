// Engine::Step reports failures as values: a sequence whose decode controller
// throws, or forces a token outside the vocabulary, finishes with kError and
// the reason; the other sequences of the batch run on unchanged, its cache is
// freed, and the engine serves the next request.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>

#include "moeserve/engine/engine.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

// Misbehaves after `after` tokens, in one of the ways a controller can.
class FaultyController : public DecodeController {
 public:
  enum class Fault { kThrowInOnToken, kThrowInMask, kForceOutOfVocabulary };
  FaultyController(Fault fault, int after, int vocab) : fault_(fault), after_(after), vocab_(vocab) {}
  void Mask(std::span<float> logits) override {
    (void)logits;
    if (fault_ == Fault::kThrowInMask && seen_ >= after_) throw std::runtime_error("grammar table lookup failed");
  }
  std::vector<int> OnToken(int token) override {
    (void)token;
    if (++seen_ < after_) return {};
    if (fault_ == Fault::kThrowInOnToken) throw std::runtime_error("json: unexpected end of input");
    if (fault_ == Fault::kForceOutOfVocabulary) return {vocab_ + 7};
    return {};
  }

 private:
  Fault fault_;
  int after_;
  int vocab_;
  int seen_ = 0;
};

struct Outcome {
  std::vector<int> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
};

std::map<SequenceId, Outcome> Drain(Engine& e) {
  std::map<SequenceId, Outcome> out;
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard)
    for (const TokenEvent& ev : e.Step()) {
      if (ev.token >= 0) out[ev.id].tokens.push_back(ev.token);
      if (ev.finish != FinishReason::kNone) {
        EXPECT_EQ(out[ev.id].finish, FinishReason::kNone) << "sequence " << ev.id << " finished twice";
        out[ev.id].finish = ev.finish;
        out[ev.id].error = ev.error;
      }
    }
  return out;
}

GenerationRequest Request(std::vector<int> prompt, int max_tokens, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = seed;
  r.stop_tokens = {-1};  // run to max_tokens: the bystander's length is known
  return r;
}

std::unique_ptr<Engine> Make(const ModelDir& dir) {
  EngineOptions o;
  o.cache_tokens = 2048;
  o.prefix_cache = false;  // so that every block in use belongs to a running sequence
  auto e = Engine::Create(dir, o);
  EXPECT_TRUE(e) << e.error().ToString();
  return std::move(*e);
}

struct Case {
  FaultyController::Fault fault;
  const char* message;  // part of the error the failed sequence reports
};

class StepErrors : public ::testing::TestWithParam<Case> {};

TEST_P(StepErrors, FailOnlyTheirSequenceAndTheEngineGoesOn) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  const int V = d->config.vocab_size;
  auto bystander = Request(TestPrompt(30, 2), 12, 5);

  std::vector<int> alone;
  {
    auto e = Make(*d);
    auto id = *e->Submit(bystander);
    alone = Drain(*e)[id].tokens;
    ASSERT_EQ(alone.size(), 12u);
  }

  auto e = Make(*d);
  auto faulty = Request(TestPrompt(20, 1), 12, 3);
  faulty.controller = std::make_shared<FaultyController>(GetParam().fault, 3, V);
  auto f = e->Submit(faulty);
  auto b = e->Submit(bystander);
  ASSERT_TRUE(f && b);
  auto out = Drain(*e);
  EXPECT_EQ(out[*f].finish, FinishReason::kError);
  EXPECT_NE(out[*f].error.find(GetParam().message), std::string::npos) << out[*f].error;
  EXPECT_LE(out[*f].tokens.size(), 3u);
  EXPECT_EQ(out[*b].finish, FinishReason::kLength) << out[*b].error;
  EXPECT_EQ(out[*b].tokens, alone) << "the failure disturbed another sequence of the batch";
  EXPECT_EQ(e->Metrics().cache_usage_ratio, 0.0) << "the failed sequence's blocks were not freed";

  // And the next request is served.
  auto next = e->Submit(bystander);
  ASSERT_TRUE(next);
  auto again = Drain(*e);
  EXPECT_EQ(again[*next].finish, FinishReason::kLength);
  EXPECT_EQ(again[*next].tokens, alone);
}

INSTANTIATE_TEST_SUITE_P(
    Engine, StepErrors,
    ::testing::Values(Case{FaultyController::Fault::kThrowInOnToken, "the decode controller failed: json: unexpected end of input"},
                      Case{FaultyController::Fault::kThrowInMask, "the decode controller failed: grammar table lookup failed"},
                      Case{FaultyController::Fault::kForceOutOfVocabulary, "outside the vocabulary"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      switch (info.param.fault) {
        case FaultyController::Fault::kThrowInOnToken: return std::string("ThrowInOnToken");
        case FaultyController::Fault::kThrowInMask: return std::string("ThrowInMask");
        case FaultyController::Fault::kForceOutOfVocabulary: return std::string("ForceOutOfVocabulary");
      }
      return std::string("Unknown");
    });

}  // namespace
}  // namespace moeserve::engine

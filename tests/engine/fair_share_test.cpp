// engine.fair_share: waiting sequences are admitted round-robin across
// tenants (FairShareOrder), so one tenant's queue of requests cannot hold
// back another's; and the prefix cache reuses a prompt only for its own
// tenant, except the public prefix.
#include <gtest/gtest.h>

#include <map>

#include "moeserve/engine/engine.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

TEST(FairShareOrder, TakesEachTenantsOldestInTurn) {
  // a arrived four times before b and c arrived once each.
  const std::vector<std::string> tenants = {"a", "a", "a", "a", "b", "c", "b"};
  const std::vector<size_t> want = {0, 4, 5, 1, 6, 2, 3};  // a b c a b a a
  EXPECT_EQ(FairShareOrder(tenants), want);
}

TEST(FairShareOrder, OneTenantKeepsArrivalOrder) {
  EXPECT_EQ(FairShareOrder({"a", "a", "a"}), (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(FairShareOrder({}).empty());
}

GenerationRequest For(const std::string& tenant, std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.tenant = tenant;
  return r;
}

// Runs the engine dry; returns each sequence's finishing event.
std::map<SequenceId, TokenEvent> Drain(Engine& e, std::vector<SequenceId>* finish_order = nullptr) {
  std::map<SequenceId, TokenEvent> done;
  for (int guard = 0; e.HasWork() && guard < 100000; ++guard) {
    for (const auto& ev : e.Step()) {
      if (ev.finish == FinishReason::kNone) continue;
      done[ev.id] = ev;
      if (finish_order) finish_order->push_back(ev.id);
    }
  }
  return done;
}

TEST(FairShare, ALateTenantIsServedBeforeTheBusyTenantsBacklog) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = 4096;
  o.max_running = 1;  // one at a time: the admission order is the finish order
  auto e = Engine::Create(*d, o);
  ASSERT_TRUE(e) << e.error().ToString();
  std::vector<SequenceId> busy;
  for (int i = 0; i < 4; ++i) busy.push_back(*(*e)->Submit(For("busy", TestPrompt(20, 10 + i), 2)));
  const SequenceId late = *(*e)->Submit(For("late", TestPrompt(20, 20), 2));
  std::vector<SequenceId> order;
  Drain(**e, &order);
  ASSERT_EQ(order.size(), 5u);
  // First come first served would finish `late` last; round-robin runs it second.
  EXPECT_EQ(order[0], busy[0]);
  EXPECT_EQ(order[1], late);
}

TEST(FairShare, APrefixCachedForOneTenantIsReusedOnlyByThatTenantOrAsThePublicPrefix) {
  auto d = OpenModelDir(TinyModel(1));
  ASSERT_TRUE(d);
  EngineOptions o;
  o.cache_tokens = 4096;
  auto e = Engine::Create(*d, o);
  ASSERT_TRUE(e) << e.error().ToString();
  auto cached = [&](GenerationRequest r) {
    auto id = (*e)->Submit(std::move(r));
    EXPECT_TRUE(id);
    return Drain(**e)[*id].usage.cached_tokens;
  };
  const std::vector<int> prompt = TestPrompt(70, 3);
  EXPECT_EQ(cached(For("a", prompt, 1)), 0);
  EXPECT_EQ(cached(For("b", prompt, 1)), 0);   // a's entry is a's
  EXPECT_EQ(cached(For("a", prompt, 1)), 64);  // a's repeat hits
  // 40 public tokens (32 block-aligned) are cached for every tenant.
  std::vector<int> pub = TestPrompt(70, 4);
  auto with_public = [&](const std::string& tenant, int tail_seed) {
    std::vector<int> p(pub.begin(), pub.begin() + 40);
    const auto tail = TestPrompt(30, tail_seed);
    p.insert(p.end(), tail.begin(), tail.end());
    GenerationRequest r = For(tenant, p, 1);
    r.public_prefix_tokens = 40;
    return r;
  };
  EXPECT_EQ(cached(with_public("a", 5)), 0);
  EXPECT_EQ(cached(with_public("b", 6)), 32);  // the public prefix only
  // Without the public marking, the same leading tokens are b's own: not a's.
  GenerationRequest unmarked = with_public("c", 7);
  unmarked.public_prefix_tokens = 0;
  EXPECT_EQ(cached(unmarked), 0);
}

}  // namespace
}  // namespace moeserve::engine

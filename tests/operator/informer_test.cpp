// Informers under a hostile watch: every watch dropped after a few events
// (half cleanly, half cut), some answered 410 Gone, history compacted. The
// cache must end equal to the server, and every deletion must be reported.
#include <gtest/gtest.h>

#include <set>

#include "moeserve/operator/informer.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

json ConfigMap(const std::string& name, int value) {
  return {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", {{"app.kubernetes.io/managed-by", "moe-operator"}}}}},
          {"data", {{"v", std::to_string(value)}}}};
}

TEST(Informer, CacheStaysCorrectThroughDroppedWatchesAndGone) {
  FakeCluster cluster(fakes::FakeApiServerOptions{.watch_history = 50, .bookmark_interval_s = 0.05});
  auto& server = cluster.server;
  server.SetFaults({.drop_watch_after_events = 3, .gone_every_nth_watch = 3});
  auto client = cluster.Client();

  std::mutex mu;
  std::set<std::string> deleted_seen, added_seen;
  InformerHandlers handlers;
  handlers.on_add = [&](const json& o) {
    std::lock_guard lock(mu);
    added_seen.insert(o["metadata"]["name"]);
  };
  handlers.on_delete = [&](const json& o) {
    std::lock_guard lock(mu);
    deleted_seen.insert(o["metadata"]["name"]);
  };
  InformerOptions options;
  options.label_selector = "app.kubernetes.io/managed-by=moe-operator";
  options.watch_timeout_s = 5;
  options.backoff_initial = std::chrono::milliseconds(5);
  options.backoff_max = std::chrono::milliseconds(50);
  Informer informer(*client, resources::kConfigMap, "team-a", options, handlers);
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(std::chrono::seconds(5)));

  std::set<std::string> deleted;
  for (int i = 0; i < 120; ++i) {
    const std::string name = "cm-" + std::to_string(i);
    ASSERT_TRUE(server.Create("configmaps", ConfigMap(name, 0)));
    if (i % 3 == 0) {
      ASSERT_TRUE(server.Mutate("configmaps", "team-a", name, [&](json& o) { o["data"]["v"] = std::to_string(i); }));
    }
    if (i % 5 == 0) {
      ASSERT_TRUE(server.Delete("configmaps", "team-a", name));
      deleted.insert(name);
    }
    if (i == 60) server.CompactHistory();  // every resourceVersion handed out so far is now 410 Gone
    std::this_thread::sleep_for(std::chrono::milliseconds(3));  // let watches stream, not only relists
  }
  auto matches = [&] {
    auto want = server.List("configmaps", "team-a");
    auto have = informer.cache().List("team-a");
    if (want.size() != have.size()) return false;
    for (const auto& o : want) {
      auto c = informer.cache().Get("team-a/" + o["metadata"]["name"].get<std::string>());
      if (!c || (*c)["data"] != o["data"]) return false;
    }
    return true;
  };
  EXPECT_TRUE(WaitFor(matches, std::chrono::seconds(10))) << "cache " << informer.cache().Size() << " vs server " << informer.relists() << " relists " << informer.watch_restarts() << " restarts, rv " << informer.last_resource_version() << " server rv " << server.CurrentResourceVersion() << " "
                                                          << server.List("configmaps", "team-a").size();
  // Every deletion of an object the informer knew about is reported, also
  // those that happened while no watch was open (found by the relist). An
  // object created and deleted entirely inside a gap was never known: as in client-go.
  EXPECT_TRUE(WaitFor([&] {
    std::lock_guard lock(mu);
    std::set<std::string> expected;
    for (const auto& name : deleted)
      if (added_seen.count(name)) expected.insert(name);
    return deleted_seen == expected && !expected.empty();
  }));
  EXPECT_GT(informer.relists(), 1u) << "410 Gone never caused a relist";
  EXPECT_GT(informer.watch_restarts(), 5u);
  // Bookmarks move the resourceVersion forward even without events.
  const std::string rv_before = informer.last_resource_version();
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", {{"name", "s"}, {"namespace", "team-a"}}}}));
  EXPECT_TRUE(WaitFor([&] { return informer.last_resource_version() != rv_before; }, std::chrono::seconds(5)));
  client->CancelWatches();
  informer.Stop();
}

}  // namespace
}  // namespace moeserve::op::testing

// moe-daemon serve with a model URI: the weight puller fills the node-local
// cache (verified against manifest.json), then the engine loads the pulled
// copy and serves it; a bad URI leaves /readyz failed with the puller's error.
#include <filesystem>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

namespace fs = std::filesystem;

TEST(ServePull, ServesAModelPulledFromAUri) {
  std::string cache = ::testing::TempDir() + "/moe_serve_pull_" + std::to_string(::getpid());
  fs::remove_all(cache);
  DaemonConfig c = TestConfig();
  c.model = "file://" + TinyModelDir() + "/";
  c.model_revision = "v1";
  c.weights_cache = cache;
  c.served_model_name = "tiny";
  auto d = StartDaemon(c);
  ASSERT_TRUE(d);
  const int port = PortOf(*d);
  EXPECT_EQ(Http(port, "GET", "/readyz").status, 200);
  auto models = Http(port, "GET", "/v1/models").Json();
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  auto r = Chat(port, {{"model", "tiny"}, {"messages", UserTurn("hi")}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.body;
  // The pulled, verified copy is in the cache.
  bool found = false;
  for (const auto& e : fs::recursive_directory_iterator(cache))
    if (e.path().filename() == "manifest.json") found = true;
  EXPECT_TRUE(found);
  d->Shutdown(0);
  fs::remove_all(cache);
}

TEST(ServePull, MissingModelFailsReadiness) {
  std::string cache = ::testing::TempDir() + "/moe_serve_pull_bad_" + std::to_string(::getpid());
  DaemonConfig c = TestConfig();
  c.model = "file:///nonexistent/moeserve/model/";
  c.weights_cache = cache;
  auto d = Daemon::Create(c);
  ASSERT_TRUE(d);
  ASSERT_TRUE((*d)->Start());
  auto st = (*d)->LoadModel();
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message().find("pulling model file:///nonexistent"), std::string::npos) << st.error().message();
  auto ready = Http(PortOf(**d), "GET", "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("failed"), std::string::npos) << ready.body;
  (*d)->Shutdown(0);
  std::filesystem::remove_all(cache);
}

}  // namespace
}  // namespace moeserve::daemon::testing

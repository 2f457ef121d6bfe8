// WeightPuller end to end over file:// and http:// sources: verification,
// atomic publication, reuse, clear errors, corruption handling, the CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moeserve/storage/commands.hpp"
#include "moeserve/storage/pull_metrics.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "moeserve/engine/manifest.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::RangeFileServer;
using testing::WriteRandomModel;

class PullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = MakeTempDir("pull-src");
    cache_ = MakeTempDir("pull-cache");
    total_ = WriteRandomModel(src_, {{"config.json", 700},
                                     {"model-00001.safetensors", 1 << 20},
                                     {"model-00002.safetensors", 300000},
                                     {"sub/tokenizer.json", 5000},
                                     {"empty.txt", 0}});
    options_.revision = "r1";
    options_.part_size = 128 << 10;
    options_.connections = 4;
    options_.log_progress = false;
    options_.retry.base_delay = std::chrono::milliseconds(10);
  }
  void TearDown() override {
    fs::remove_all(src_);
    fs::remove_all(cache_);
  }
  std::string src_, cache_;
  uint64_t total_ = 0;
  PullOptions options_;
};

TEST_F(PullTest, FileSourceIsVerifiedAndPublished) {
  WeightPuller puller({cache_});
  PullStatus status;
  auto pulled = puller.Pull("file://" + src_, options_, &status);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_FALSE(pulled->stats.reused);
  EXPECT_EQ(pulled->stats.bytes_total, total_);
  EXPECT_TRUE(pulled->lease.held());
  EXPECT_EQ(status.Snapshot().state, PullState::kReady);
  EXPECT_TRUE(status.Ready());
  EXPECT_EQ(pulled->dir.rfind(cache_ + "/models/", 0), 0u);
  std::ifstream in(pulled->dir + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto manifest = engine::ParseManifest(text);
  ASSERT_TRUE(manifest);
  EXPECT_EQ(manifest->files.size(), 5u);
  EXPECT_TRUE(engine::VerifyManifest(*manifest, pulled->dir)) << "the cached copy verifies";
  EXPECT_FALSE(fs::exists(pulled->dir + "/.pull")) << "no resume state in a published model";
  EXPECT_TRUE(fs::is_empty(cache_ + "/partial"));
}

TEST_F(PullTest, SecondPullReusesTheCache) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  auto second = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_TRUE(second->stats.reused);
  EXPECT_EQ(second->stats.bytes_total, total_);
  EXPECT_EQ(second->stats.bytes_fetched, 0u);
  EXPECT_EQ(second->dir, first->dir);
  // Another revision of the same URI is another cache entry.
  options_.revision = "r2";
  auto other = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(other) << other.error().ToString();
  EXPECT_FALSE(other->stats.reused);
  EXPECT_NE(other->dir, first->dir);
}

TEST_F(PullTest, HttpSourceUsesParallelRangedGets) {
  RangeFileServer server(src_);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(server.url(), options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  // manifest + one GET per 128 KiB part: 1 MiB file = 8 parts, 300000 = 3, the small ones 1 each.
  EXPECT_GE(server.requests(), 1 + 8 + 3 + 1 + 1);
  EXPECT_EQ(pulled->stats.bytes_fetched, total_ + fs::file_size(src_ + "/manifest.json"));
  EXPECT_EQ(server.body_bytes(), pulled->stats.bytes_fetched);
  std::ifstream in(pulled->dir + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(engine::VerifyManifest(*engine::ParseManifest(text), pulled->dir));
}

TEST_F(PullTest, MissingManifestIsAnErrorUnlessNoVerify) {
  fs::remove(src_ + "/manifest.json");
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(pulled.error().message().find("manifest.json"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("--no-verify"), std::string::npos) << pulled.error().message();

  options_.verify = false;
  auto unverified = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(unverified) << unverified.error().ToString();
  EXPECT_EQ(fs::file_size(unverified->dir + "/model-00001.safetensors"), 1u << 20);

  // An http source cannot be listed, so even --no-verify needs the manifest there.
  RangeFileServer server(src_);
  options_.revision = "r-http";
  auto http = puller.Pull(server.url(), options_);
  ASSERT_FALSE(http);
  EXPECT_NE(http.error().message().find("cannot be listed"), std::string::npos) << http.error().message();
}

TEST_F(PullTest, MissingObjectFailsAtOnceNamingIt) {
  fs::remove(src_ + "/model-00002.safetensors");
  RangeFileServer server(src_);
  WeightPuller puller({cache_});
  options_.retry.max_attempts = 8;
  auto pulled = puller.Pull(server.url(), options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(pulled.error().message().find("model-00002.safetensors"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("404"), std::string::npos) << pulled.error().message();
  EXPECT_FALSE(fs::exists(cache_ + "/models/" + ModelCache::Key(server.url(), "r1")));
}

TEST_F(PullTest, CorruptObjectIsFetchedOnceMoreThenFails) {
  // The stored shard no longer matches manifest.json (same size, one byte flipped).
  {
    std::fstream f(src_ + "/model-00002.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1234);
    char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(1234);
    f.put(c);
  }
  RangeFileServer server(src_);
  WeightPuller puller({cache_});
  PullStatus status;
  auto pulled = puller.Pull(server.url(), options_, &status);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kCorruption);
  EXPECT_NE(pulled.error().message().find("model-00002.safetensors"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("sha256 mismatch"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("second time"), std::string::npos) << pulled.error().message();
  EXPECT_EQ(status.Snapshot().state, PullState::kFailed);
  EXPECT_NE(status.Snapshot().ToJson().find("\"state\":\"failed\""), std::string::npos);
  // Fetched exactly twice: the other files once, the corrupt one again.
  uint64_t manifest_size = fs::file_size(src_ + "/manifest.json");
  EXPECT_LE(server.body_bytes(), total_ + 300000 + manifest_size);
  EXPECT_GE(server.body_bytes(), 2 * 300000u);
  EXPECT_FALSE(fs::exists(cache_ + "/models/" + ModelCache::Key(server.url(), "r1")));
}

TEST_F(PullTest, UnsupportedSchemeIsRejected) {
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("ftp://host/x/", options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(PullTest, CommandLinePullPrintsTheModelDirectory) {
  std::string uri = "file://" + src_;
  std::vector<std::string> args = {"pull", uri, "--revision", "cli", "--cache", cache_, "--connections", "3",
                                   "--part-size", "64KiB", "--quiet"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  int rc = RunPullCommand(static_cast<int>(argv.size()), argv.data());
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, cache_ + "/models/" + ModelCache::Key(uri, "cli") + "\n");

  std::vector<std::string> bad = {"pull", uri, "--cache", cache_};  // no --revision
  std::vector<char*> bad_argv;
  for (auto& a : bad) bad_argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunPullCommand(static_cast<int>(bad_argv.size()), bad_argv.data()), 2);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("missing --revision"), std::string::npos);
}

TEST_F(PullTest, MetricsCountPulledBytes) {
  uint64_t before = GlobalPullMetrics().bytes_pulled_total.load();
  WeightPuller puller({cache_});
  ASSERT_TRUE(puller.Pull("file://" + src_, options_));
  EXPECT_EQ(GlobalPullMetrics().bytes_pulled_total.load() - before, total_);
  std::string text = PullMetricsText();
  EXPECT_NE(text.find("moe_weights_bytes_pulled_total"), std::string::npos) << text;
  EXPECT_NE(text.find("moe_weights_pull_duration_seconds_bucket"), std::string::npos) << text;
  EXPECT_NE(text.find("moe_weights_pulls_total{result=\"downloaded\"}"), std::string::npos) << text;
}

}  // namespace
}  // namespace moeserve::storage

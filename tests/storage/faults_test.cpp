// Pulls through a TCP proxy that breaks connections: cut after N bytes,
// stalled mid-body. The pull must finish, verified, without fetching completed
// bytes again (the proxy counts every byte it forwards: < 1.1x the model).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moeserve/storage/weight_puller.hpp"
#include "moeserve/engine/manifest.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::FaultPlan;
using testing::FaultProxy;
using testing::MakeTempDir;
using testing::RangeFileServer;

class FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = MakeTempDir("faults-src");
    cache_ = MakeTempDir("faults-cache");
    total_ = testing::WriteRandomModel(src_, {{"config.json", 900},
                                              {"model-00001.safetensors", 1600000},
                                              {"model-00002.safetensors", 1500000},
                                              {"model-00003.safetensors", 900000}});
    total_ += fs::file_size(src_ + "/manifest.json");
    options_.revision = "r";
    options_.part_size = 512 << 10;
    options_.connections = 4;
    options_.log_progress = false;
    options_.retry.base_delay = std::chrono::milliseconds(5);
    options_.retry.max_delay = std::chrono::milliseconds(50);
  }
  void TearDown() override {
    fs::remove_all(src_);
    fs::remove_all(cache_);
  }
  std::string src_, cache_;
  uint64_t total_ = 0;
  PullOptions options_;
};

TEST_F(FaultsTest, ConnectionsCutEvery100KiBStillFinishWithoutRefetching) {
  RangeFileServer server(src_);
  FaultPlan plan;
  plan.cut_after_bytes = 100 << 10;  // headers included: every response dies mid-body
  FaultProxy proxy(server.port(), plan);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(proxy.url() + "/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_GT(proxy.faults(), 30);
  EXPECT_LT(static_cast<double>(proxy.bytes_to_client()), 1.1 * static_cast<double>(total_))
      << "fetched " << proxy.bytes_to_client() << " bytes for a " << total_ << "-byte model";
  EXPECT_EQ(pulled->stats.bytes_fetched, total_) << "every body byte exactly once";
}

TEST_F(FaultsTest, StalledStreamsAreAbandonedAndResumed) {
  RangeFileServer server(src_);
  FaultPlan plan;
  plan.stall_after_bytes = 200 << 10;
  plan.faulty_connections = 3;  // the first three connections hang mid-body
  FaultProxy proxy(server.port(), plan);
  options_.source.stall_timeout = std::chrono::seconds(1);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(proxy.url() + "/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  // Which connections carry enough bytes to reach the stall depends on scheduling.
  EXPECT_GE(proxy.faults(), 1);
  EXPECT_LT(static_cast<double>(proxy.bytes_to_client()), 1.1 * static_cast<double>(total_));
}

TEST_F(FaultsTest, ServerErrorsAreRetriedWithBackoff) {
  RangeFileServer server(src_);
  FaultPlan plan;
  plan.canned_response = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  plan.faulty_connections = 4;
  FaultProxy proxy(server.port(), plan);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(proxy.url() + "/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(proxy.faults(), 4);
}

TEST_F(FaultsTest, BytesCorruptedInTransitAreCaughtAndFetchedOnceMore) {
  RangeFileServer server(src_);
  FaultPlan plan;
  // One flipped byte in the whole pull: the manifest's connection is too short
  // to reach it, the single download stream is not. (With two streams each
  // could flip a byte of the same file, and a second mismatch is rightly fatal.)
  plan.corrupt_at_byte = 150000;
  plan.faulty_connections = 2;
  FaultProxy proxy(server.port(), plan);
  options_.connections = 1;
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(proxy.url() + "/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(proxy.faults(), 1);
  EXPECT_EQ(pulled->stats.files_refetched, 1) << "sha256 caught the flipped byte";
  std::ifstream in(pulled->dir + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(engine::VerifyManifest(*engine::ParseManifest(text), pulled->dir));
}

TEST_F(FaultsTest, PersistentFailureGivesUpAndTheNextPullResumes) {
  RangeFileServer server(src_);
  FaultPlan plan;
  plan.cut_after_bytes = 300 << 10;
  FaultProxy proxy(server.port(), plan);
  // One attempt per part: the first cut is final for this pull.
  options_.retry.max_attempts = 1;
  WeightPuller puller({cache_});
  auto failed = puller.Pull(proxy.url() + "/", options_);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), ErrorCode::kUnavailable) << failed.error().ToString();
  EXPECT_NE(failed.error().message().find("giving up"), std::string::npos) << failed.error().message();
  std::string key = ModelCache::Key(proxy.url() + "/", "r");
  EXPECT_FALSE(fs::exists(cache_ + "/models/" + key)) << "a partial model is never published";
  EXPECT_TRUE(fs::exists(cache_ + "/partial/" + key + "/.pull/progress.bin"));

  proxy.SetPlan({});
  options_.retry.max_attempts = 8;
  auto pulled = puller.Pull(proxy.url() + "/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_GT(pulled->stats.bytes_resumed, 0u);
  EXPECT_LT(static_cast<double>(proxy.bytes_to_client()), 1.1 * static_cast<double>(total_));
}

}  // namespace
}  // namespace moeserve::storage

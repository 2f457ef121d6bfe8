// storage.cache_primitives: the small parts of the library the pull and
// publish paths lean on: file locks between processes sharing a cache, the
// cache's layout and key, the retry policy's waits and what is retried, and
// the pull progress a daemon reports.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/storage/model_cache.hpp"
#include "moeserve/storage/pull_status.hpp"
#include "moeserve/storage/retry_policy.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

fs::path FreshDir(const char* name) {
  std::string tmpl = (fs::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") / name).string() + ".XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

TEST(CacheLocks, AnExclusiveLockKeepsOthersOutUntilReleased) {
  const fs::path dir = FreshDir("locks");
  const std::string path = (dir / "k.pull").string();
  auto held = LockFile(path, LockMode::kExclusive);
  ASSERT_TRUE(held) << held.error().message();
  ASSERT_TRUE(held->held());
  // flock is per open file: a second open in this process is a second holder.
  auto other = LockFile(path, LockMode::kExclusive, /*try_only=*/true);
  ASSERT_TRUE(other) << other.error().message();
  EXPECT_FALSE(other->held());
  auto shared = LockFile(path, LockMode::kShared, true);
  ASSERT_TRUE(shared);
  EXPECT_FALSE(shared->held());
  held->Release();
  auto again = LockFile(path, LockMode::kExclusive, true);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->held());
  fs::remove_all(dir);
}

TEST(CacheLocks, SharedLocksCoexistAndAnExclusiveWaitsForAll) {
  const fs::path dir = FreshDir("locks");
  const std::string path = (dir / "k.use").string();
  auto a = LockFile(path, LockMode::kShared, true);
  auto b = LockFile(path, LockMode::kShared, true);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->held());
  EXPECT_TRUE(b->held());
  auto x = LockFile(path, LockMode::kExclusive, true);
  ASSERT_TRUE(x);
  EXPECT_FALSE(x->held());
  fs::remove_all(dir);
}

TEST(CacheLocks, ALockPathThatIsALinkIsRefused) {
  const fs::path dir = FreshDir("locks");
  fs::create_symlink(dir / "elsewhere", dir / "k.pull");
  auto lock = LockFile((dir / "k.pull").string(), LockMode::kExclusive);
  ASSERT_FALSE(lock);
  EXPECT_EQ(lock.error().code(), ErrorCode::kPermissionDenied) << lock.error().message();
  EXPECT_FALSE(fs::exists(dir / "elsewhere")) << "the link's target must not be created";
  fs::remove_all(dir);
}

TEST(ModelCacheLayout, OpenMakesItsFoldersAndKeysNameUriRevisionAndVerification) {
  const fs::path dir = FreshDir("cache");
  auto cache = ModelCache::Open({(dir / "root").string(), 0});
  ASSERT_TRUE(cache) << cache.error().message();
  for (const char* sub : {"models", "partial", "meta", "locks", "trash"}) EXPECT_TRUE(fs::is_directory(dir / "root" / sub)) << sub;
  const std::string k = ModelCache::Key("s3://b/m", "main");
  EXPECT_EQ(k, ModelCache::Key("s3://b/m", "main"));
  EXPECT_NE(k, ModelCache::Key("s3://b/m", "v2"));
  EXPECT_NE(k, ModelCache::Key("s3://b/n", "main"));
  EXPECT_NE(k, ModelCache::Key("s3://b/m", "main", /*verified=*/false));
  EXPECT_EQ(k.find('/'), std::string::npos) << "a key is one path segment: " << k;
  EXPECT_EQ(cache->ModelPath(k), (dir / "root").string() + "/models/" + k);
  auto use = cache->LockForPull(k);
  ASSERT_TRUE(use) << use.error().message();
  EXPECT_TRUE(use->held());
  EXPECT_FALSE(ModelCache::Open({"", 0})) << "an empty root is refused";
  fs::remove_all(dir);
}

TEST(RetryPolicy, WaitsGrowWithJitterUpToTheCapAndHonourRetryAfter) {
  RetryPolicy p;  // 200 ms base, 10 s cap, Retry-After clamped to 60 s
  std::mt19937_64 rng(38);
  for (int failures = 1; failures <= 12; ++failures) {
    const int64_t ceiling = std::min<int64_t>(10000, int64_t{200} << (failures - 1));
    for (int i = 0; i < 50; ++i) {
      const int64_t d = p.Delay(failures, std::nullopt, rng).count();
      EXPECT_GE(d, ceiling / 4) << "failures " << failures;
      EXPECT_LE(d, ceiling) << "failures " << failures;
    }
  }
  EXPECT_EQ(p.Delay(1, milliseconds(1500), rng), milliseconds(1500));
  EXPECT_EQ(p.Delay(1, milliseconds(3600000), rng), milliseconds(60000));
  EXPECT_TRUE(IsRetryable(Error::Unavailable("503")));
  EXPECT_TRUE(IsRetryable(Error::Timeout("stalled")));
  EXPECT_FALSE(IsRetryable(Error::NotFound("404")));
  EXPECT_FALSE(IsRetryable(Error::PermissionDenied("403")));
  EXPECT_FALSE(IsRetryable(Error::InvalidArgument("bad key")));
}

TEST(PullProgress, JsonAndLogLineSayWhereAPullStands) {
  PullProgress p;
  p.state = PullState::kDownloading;
  p.uri = "s3://b/m";
  p.revision = "main";
  p.bytes_total = 200;
  p.bytes_done = 50;
  p.bytes_fetched = 40;
  p.eta_s = 2.6;
  const nlohmann::json j = nlohmann::json::parse(p.ToJson());
  EXPECT_EQ(j.at("state"), "downloading");
  EXPECT_EQ(j.at("uri"), "s3://b/m");
  EXPECT_EQ(j.at("bytes_total"), 200);
  EXPECT_EQ(j.at("bytes_done"), 50);
  EXPECT_EQ(j.at("bytes_fetched"), 40);
  EXPECT_DOUBLE_EQ(j.at("eta_s").get<double>(), 2.6);
  const std::string line = p.ToLogLine();
  EXPECT_EQ(line.rfind("pull downloading: ", 0), 0u) << line;
  EXPECT_NE(line.find("(25%)"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 3s"), std::string::npos) << line;
  p.eta_s = -1;  // unknown: no ETA at all
  EXPECT_FALSE(nlohmann::json::parse(p.ToJson()).contains("eta_s"));
  EXPECT_EQ(p.ToLogLine().find("ETA"), std::string::npos);
  EXPECT_EQ(PullStateName(PullState::kWaitingForLock), "waiting_for_lock");
  EXPECT_EQ(PullStateName(PullState::kFailed), "failed");
}

}  // namespace
}  // namespace moeserve::storage

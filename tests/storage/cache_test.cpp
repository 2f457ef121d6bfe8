// The shared node-local cache: concurrent pulls from separate processes
// download once; kill -9 in the middle of a pull leaves nothing visible and the
// next pull resumes; LRU eviction under a size limit skips models in use.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "moeserve/storage/commands.hpp"
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
using testing::Subprocess;

// Child mode: with MOESERVE_PULL_CHILD=1 this test binary is `moe-daemon pull`
// (its arguments follow argv[0]), so tests can run real puller processes
// without depending on the moe-daemon executable.
const int kChildMode = [] {
  if (!std::getenv("MOESERVE_PULL_CHILD")) return 0;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t b = 0, e; b < all.size(); b = e + 1) {
    e = all.find('\0', b);
    if (e == std::string::npos) e = all.size();
    args.push_back(all.substr(b, e - b));
  }
  std::vector<char*> argv;
  for (size_t i = 1; i < args.size(); ++i) argv.push_back(args[i].data());
  int rc = RunPullCommand(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  std::exit(rc);
  return 1;
}();

std::string SelfExe() { return fs::read_symlink("/proc/self/exe").string(); }

Subprocess StartPuller(const std::string& uri, const std::string& cache, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {SelfExe(), "pull", uri, "--revision", "r", "--cache", cache,
                                   "--part-size", "256KiB", "--connections", "4", "--quiet"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Subprocess(argv, {"MOESERVE_PULL_CHILD=1"});
}

uint64_t RecordedBytes(const std::string& partial) {
  std::ifstream in(partial + "/.pull/progress.bin", std::ios::binary);
  uint64_t total = 0, v = 0;
  while (in.read(reinterpret_cast<char*>(&v), sizeof(v))) total += v;
  return total;
}

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = MakeTempDir("cache-src");
    cache_ = MakeTempDir("cache-cache");
    total_ = testing::WriteRandomModel(src_, {{"config.json", 500},
                                              {"model-00001.safetensors", 1500000},
                                              {"model-00002.safetensors", 1500000},
                                              {"model-00003.safetensors", 1000000}});
    total_ += fs::file_size(src_ + "/manifest.json");
  }
  void TearDown() override {
    fs::remove_all(src_);
    fs::remove_all(cache_);
  }
  std::string src_, cache_;
  uint64_t total_ = 0;
};

TEST_F(CacheTest, TwoProcessesPullingOneModelDownloadItOnce) {
  RangeFileServer server(src_);
  Subprocess a = StartPuller(server.url(), cache_);
  Subprocess b = StartPuller(server.url(), cache_);
  std::string out_a = a.WaitForLine("/models/", std::chrono::seconds(50));
  std::string out_b = b.WaitForLine("/models/", std::chrono::seconds(50));
  EXPECT_EQ(a.Wait(), 0);
  EXPECT_EQ(b.Wait(), 0);
  EXPECT_EQ(out_a, cache_ + "/models/" + ModelCache::Key(server.url(), "r"));
  EXPECT_EQ(out_a, out_b);
  EXPECT_EQ(server.body_bytes(), total_) << "one download (manifest included), the other process reused it";
}

TEST_F(CacheTest, ASecondPullerWaitsForTheLockThenReuses) {
  PullOptions options;
  options.revision = "r";
  options.log_progress = false;
  std::string uri = "file://" + src_;
  WeightPuller puller({cache_});
  ASSERT_TRUE(puller.Pull(uri, options));
  auto cache = ModelCache::Open({cache_});
  ASSERT_TRUE(cache);
  // This test plays the first puller: it holds the model's pull lock.
  auto lock = cache->LockForPull(ModelCache::Key(uri, "r"));
  ASSERT_TRUE(lock);
  PullStatus status;
  Result<PulledModel> second = Fail(Error::Internal("not run"));
  std::thread waiter([&] { second = puller.Pull(uri, options, &status); });
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (status.Snapshot().state != PullState::kWaitingForLock && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(status.Snapshot().state, PullState::kWaitingForLock) << "still blocked behind the lock";
  EXPECT_NE(status.Snapshot().ToJson().find("waiting_for_lock"), std::string::npos);
  lock->Release();
  waiter.join();
  ASSERT_TRUE(second) << second.error().ToString();
  EXPECT_TRUE(second->stats.reused);
  EXPECT_TRUE(status.Ready());
}

TEST_F(CacheTest, KillDashNineMidPullThenResume) {
  RangeFileServer server(src_);
  FaultPlan plan;
  plan.stall_after_bytes = 400 << 10;  // every stream hangs part-way, so the child is mid-pull
  FaultProxy proxy(server.port(), plan);
  std::string uri = proxy.url() + "/";
  std::string key = ModelCache::Key(uri, "r");
  std::string partial = cache_ + "/partial/" + key;
  Subprocess child = StartPuller(uri, cache_, {"--stall-timeout", "60"});
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  // Kill once every stream has hit the stall and the child has written what
  // it received (the record stops growing): bytes still in socket buffers at
  // the kill would be lost and fetched again, which is not what this measures.
  uint64_t last = 0;
  auto stable_since = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < until) {
    uint64_t now_bytes = RecordedBytes(partial);
    if (now_bytes != last) {
      last = now_bytes;
      stable_since = std::chrono::steady_clock::now();
    } else if (now_bytes >= (1u << 20) && std::chrono::steady_clock::now() - stable_since > std::chrono::milliseconds(500)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  uint64_t before_kill = RecordedBytes(partial);
  ASSERT_GE(before_kill, 1u << 20) << "the child never got going";
  child.Kill();  // SIGKILL: no cleanup runs
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  EXPECT_FALSE(fs::exists(cache_ + "/models/" + key)) << "the cache must never expose a partial model";
  EXPECT_TRUE(fs::exists(partial));

  proxy.SetPlan({});
  PullOptions options;
  options.revision = "r";
  options.log_progress = false;
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(uri, options);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_GE(pulled->stats.bytes_resumed, before_kill);
  EXPECT_LT(static_cast<double>(proxy.bytes_to_client()), 1.1 * static_cast<double>(total_))
      << "both runs together fetched " << proxy.bytes_to_client() << " for " << total_;
  std::ifstream in(pulled->dir + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(engine::VerifyManifest(*engine::ParseManifest(text), pulled->dir));
  EXPECT_FALSE(fs::exists(partial));
}

TEST_F(CacheTest, LruEvictionNeverEvictsAModelInUse) {
  // Three 1 MB models; the cache holds two and a half.
  std::vector<std::string> sources;
  for (int i = 0; i < 4; ++i) {
    sources.push_back(src_ + "/m" + std::to_string(i));
    testing::WriteRandomModel(sources.back(), {{"w.bin", 1000000}}, 100 + i);
  }
  PullOptions options;
  options.revision = "r";
  options.log_progress = false;
  WeightPuller puller({cache_, 2500000});
  auto a = puller.Pull("file://" + sources[0], options);  // held (lease kept) throughout
  ASSERT_TRUE(a) << a.error().ToString();
  std::string b_dir;
  {
    auto b = puller.Pull("file://" + sources[1], options);
    ASSERT_TRUE(b) << b.error().ToString();
    b_dir = b->dir;
  }  // b's lease ends: evictable
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto c = puller.Pull("file://" + sources[2], options);
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(fs::exists(a->dir)) << "a is older but in use";
  EXPECT_FALSE(fs::exists(b_dir)) << "b is the least recently used model nobody holds";
  EXPECT_TRUE(fs::exists(c->dir));

  // a and c held: no room for d.
  auto d = puller.Pull("file://" + sources[3], options);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(d.error().message().find("in use"), std::string::npos) << d.error().message();
  EXPECT_TRUE(fs::exists(a->dir));
  EXPECT_TRUE(fs::exists(c->dir));

  std::string a_dir = a->dir;
  a->lease.Release();
  auto d2 = puller.Pull("file://" + sources[3], options);
  ASSERT_TRUE(d2) << d2.error().ToString();
  EXPECT_FALSE(fs::exists(a_dir));
  EXPECT_TRUE(fs::exists(c->dir));
}

TEST_F(CacheTest, AbandonedPartialDownloadsGoFirstUnderTheLimit) {
  std::string a = src_ + "/a", b = src_ + "/b";
  testing::WriteRandomModel(a, {{"w.bin", 1000000}}, 7);
  testing::WriteRandomModel(b, {{"w.bin", 1000000}}, 8);
  PullOptions options;
  options.revision = "r";
  options.log_progress = false;
  // a's pull fails for good (the object vanished), leaving a 1 MB partial download.
  fs::rename(a + "/w.bin", a + "/w.moved");
  fs::copy_file(a + "/w.moved", a + "/w.bin.part");
  {
    std::ofstream(a + "/w.bin", std::ios::binary) << std::string(500000, 'x');  // too short: a hard error
  }
  WeightPuller puller({cache_, 1500000});
  auto failed = puller.Pull("file://" + a, options);
  ASSERT_FALSE(failed);
  std::string a_partial = cache_ + "/partial/" + ModelCache::Key("file://" + a, "r");
  ASSERT_TRUE(fs::exists(a_partial));
  // b needs the room: the abandoned partial goes.
  auto pulled = puller.Pull("file://" + b, options);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_FALSE(fs::exists(a_partial));
}

TEST_F(CacheTest, ModelHeldByAnotherProcessIsNotEvicted) {
  auto cache = ModelCache::Open({cache_, 1});
  ASSERT_TRUE(cache);
  PullOptions options;
  options.revision = "r";
  options.log_progress = false;
  WeightPuller puller({cache_});
  std::string key;
  {
    auto pulled = puller.Pull("file://" + src_, options);
    ASSERT_TRUE(pulled);
    key = ModelCache::Key("file://" + src_, "r");
  }
  // A child process takes a lease (shared flock) and holds it until killed.
  pid_t pid = ::fork();
  if (pid == 0) {
    auto lease = cache->Lease(key);
    ::pause();
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto evicted = cache->TryEvict(key);
  ASSERT_TRUE(evicted);
  EXPECT_FALSE(*evicted);
  EXPECT_TRUE(cache->IsComplete(key));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  evicted = cache->TryEvict(key);
  ASSERT_TRUE(evicted);
  EXPECT_TRUE(*evicted) << "the lease died with its process";
  EXPECT_FALSE(cache->IsComplete(key));
}

TEST_F(CacheTest, FreeSpaceIsCheckedBeforeStarting) {
  auto cache = ModelCache::Open({cache_});
  ASSERT_TRUE(cache);
  EXPECT_TRUE(cache->CheckFreeSpace(1));
  auto full = cache->CheckFreeSpace(uint64_t{1} << 62);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code(), ErrorCode::kResourceExhausted);
}

TEST_F(CacheTest, StatusJsonForReadyz) {
  PullStatus status;
  status.Begin("s3://b/m/", "v1");
  status.SetState(PullState::kDownloading);
  status.SetTotal(1000, 250);
  auto json = status.Snapshot().ToJson();
  EXPECT_NE(json.find("\"state\":\"downloading\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"bytes_total\":1000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"bytes_done\":250"), std::string::npos) << json;
  EXPECT_FALSE(status.Ready());
}

}  // namespace
}  // namespace moeserve::storage

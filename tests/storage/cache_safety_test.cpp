// A cache directory that others can write to (a shared node cache): an
// unverified pull never satisfies a verified request, and symbolic links
// planted where the puller reads or writes are errors, never followed, so
// they redirect neither the model a daemon serves nor the puller's writes.
// Keys are found by listing the cache after a first pull, as an attacker would.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moeserve/storage/weight_puller.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::RangeFileServer;
using testing::WriteRandomModel;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The one entry of dir whose name ends with suffix.
std::string OnlyEntry(const std::string& dir, const std::string& suffix = "") {
  std::string found;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!name.ends_with(suffix)) continue;
    EXPECT_TRUE(found.empty()) << dir << " holds " << found << " and " << name;
    found = name;
  }
  return found;
}

class CacheSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = MakeTempDir("safety-src");
    cache_ = MakeTempDir("safety-cache");
    victim_ = MakeTempDir("safety-victim");
    WriteRandomModel(src_, {{"config.json", 400}, {"a.bin", 300000}, {"b.bin", 200000}});
    options_.revision = "r";
    options_.log_progress = false;
    options_.connections = 2;
    options_.part_size = 64 << 10;
    options_.retry.base_delay = std::chrono::milliseconds(5);
    options_.retry.max_attempts = 2;
  }
  void TearDown() override {
    fs::remove_all(src_);
    fs::remove_all(cache_);
    fs::remove_all(victim_);
  }
  // Leaves partial/<key> behind by failing a pull over http (b.bin missing); returns <key>.
  std::string LeavePartialDownload(RangeFileServer& server) {
    fs::rename(src_ + "/b.bin", src_ + "/b.bin.away");
    WeightPuller puller({cache_});
    auto failed = puller.Pull(server.url(), options_);
    EXPECT_FALSE(failed);
    fs::rename(src_ + "/b.bin.away", src_ + "/b.bin");
    return OnlyEntry(cache_ + "/partial");
  }
  std::string src_, cache_, victim_;
  PullOptions options_;
};

TEST_F(CacheSafetyTest, UnverifiedPullNeverSatisfiesAVerifiedRequest) {
  fs::remove(src_ + "/manifest.json");
  WeightPuller puller({cache_});
  options_.verify = false;
  auto unverified = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(unverified) << unverified.error().ToString();

  options_.verify = true;
  auto verified = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(verified) << "served the unverified copy " << verified->dir << " to a verified request";
  EXPECT_EQ(verified.error().code(), ErrorCode::kNotFound) << verified.error().ToString();
  EXPECT_NE(verified.error().message().find("manifest.json"), std::string::npos) << verified.error().message();

  // With a manifest the verified request downloads and checks its own copy.
  auto manifest = engine::BuildManifest(src_);
  ASSERT_TRUE(manifest);
  std::ofstream(src_ + "/manifest.json") << manifest->ToJson();
  auto checked = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(checked) << checked.error().ToString();
  EXPECT_FALSE(checked->stats.reused);
  EXPECT_NE(checked->dir, unverified->dir);
  EXPECT_TRUE(fs::exists(checked->dir + "/manifest.json"));

  // Both stay in the cache; each request reuses its own kind.
  auto again = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_TRUE(again->stats.reused);
  EXPECT_EQ(again->dir, checked->dir);
  options_.verify = false;
  auto again_unverified = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(again_unverified) << again_unverified.error().ToString();
  EXPECT_TRUE(again_unverified->stats.reused);
}

// A model whose meta file does not record verification (a puller that did
// not write the flag) is hashed again before a verified request reuses it.
TEST_F(CacheSafetyTest, ModelNotRecordedAsVerifiedIsVerifiedAgainBeforeReuse) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  first->lease.Release();
  std::string meta = cache_ + "/meta/" + fs::path(first->dir).filename().string() + ".json";
  std::string recorded = ReadAll(meta);
  ASSERT_NE(recorded.find("\"verified\":true"), std::string::npos) << recorded;
  auto unrecorded = [&] {
    std::string text = ReadAll(meta);
    text.replace(text.find(",\"verified\":true"), 16, "");
    std::ofstream(meta, std::ios::trunc) << text;
  };
  unrecorded();
  auto again = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(again) << again.error().ToString();
  EXPECT_TRUE(again->stats.reused) << "intact: verified again and reused";
  EXPECT_NE(ReadAll(meta).find("\"verified\":true"), std::string::npos) << "recorded now: " << ReadAll(meta);
  again->lease.Release();

  // Same size, other bytes, not recorded as verified: it fails the hash, is
  // evicted, and the model is pulled again from the source.
  unrecorded();
  {
    std::fstream f(first->dir + "/a.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.write("POISON", 6);
  }
  auto fresh = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(fresh) << fresh.error().ToString();
  EXPECT_FALSE(fresh->stats.reused) << "served bytes that do not match the manifest";
  EXPECT_TRUE(ReadAll(fresh->dir + "/a.bin") == ReadAll(src_ + "/a.bin"));
}

TEST_F(CacheSafetyTest, VerifiedCopySatisfiesAnUnverifiedRequest) {
  WeightPuller puller({cache_});
  auto verified = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(verified) << verified.error().ToString();
  verified->lease.Release();
  options_.verify = false;
  auto unverified = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(unverified) << unverified.error().ToString();
  EXPECT_TRUE(unverified->stats.reused);
  EXPECT_EQ(unverified->dir, verified->dir);
}

// Reuse checks kinds and sizes; bytes changed in place are caught only by
// hashing again, which reverify_cached (--reverify) asks for.
TEST_F(CacheSafetyTest, ReverifyCatchesBytesChangedInPlace) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  first->lease.Release();
  {
    std::fstream f(first->dir + "/a.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.write("POISON", 6);
  }
  options_.reverify_cached = true;
  auto rehashed = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(rehashed) << "reused a changed model";
  EXPECT_EQ(rehashed.error().code(), ErrorCode::kCorruption) << rehashed.error().ToString();
  EXPECT_NE(rehashed.error().message().find("a.bin"), std::string::npos) << rehashed.error().message();
  EXPECT_NE(rehashed.error().message().find("sha256"), std::string::npos) << rehashed.error().message();

  // A file cut short is caught without hashing.
  fs::resize_file(first->dir + "/b.bin", 1000);
  options_.reverify_cached = false;
  auto sized = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(sized);
  EXPECT_NE(sized.error().message().find("b.bin"), std::string::npos) << sized.error().message();
  EXPECT_NE(sized.error().message().find("1000 bytes"), std::string::npos) << sized.error().message();
}

TEST_F(CacheSafetyTest, ModelFileSwappedForASymlinkIsAnErrorNotServed) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  first->lease.Release();
  // Same size, other bytes: only a check that does not follow the link notices.
  std::string poisoned(300000, 'P');
  std::ofstream(victim_ + "/a.bin", std::ios::binary) << poisoned;
  fs::remove(first->dir + "/a.bin");
  fs::create_symlink(victim_ + "/a.bin", first->dir + "/a.bin");

  auto second = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(second) << "reused " << second->dir << " with a.bin pointing at " << fs::read_symlink(second->dir + "/a.bin");
  EXPECT_NE(second.error().message().find("a.bin"), std::string::npos) << second.error().message();
  EXPECT_NE(second.error().message().find("symbolic link"), std::string::npos) << second.error().message();
}

TEST_F(CacheSafetyTest, ModelFolderSwappedForASymlinkIsAnErrorNotServed) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  first->lease.Release();
  // The attacker's copy: the same files, one poisoned, the manifest adjusted to match.
  std::string fake = victim_ + "/model";
  fs::copy(first->dir, fake, fs::copy_options::recursive);
  std::ofstream(fake + "/a.bin", std::ios::binary | std::ios::trunc) << std::string(300000, 'P');
  auto manifest = engine::BuildManifest(fake);
  ASSERT_TRUE(manifest);
  std::ofstream(fake + "/manifest.json", std::ios::trunc) << manifest->ToJson();
  fs::remove_all(first->dir);
  fs::create_directory_symlink(fake, first->dir);

  auto second = puller.Pull("file://" + src_, options_);
  ASSERT_FALSE(second) << "reused " << second->dir << " -> " << fs::read_symlink(second->dir);
  EXPECT_NE(second.error().message().find("symbolic link"), std::string::npos) << second.error().message();
}

TEST_F(CacheSafetyTest, SymlinkInAPartialDownloadDoesNotRedirectWrites) {
  RangeFileServer server(src_);
  std::string key = LeavePartialDownload(server);
  ASSERT_FALSE(key.empty());
  std::string partial = cache_ + "/partial/" + key;
  ASSERT_TRUE(fs::exists(partial + "/b.bin"));
  // b.bin never got a byte, so a resuming puller writes all of it.
  std::ofstream(victim_ + "/precious", std::ios::binary) << "precious data";
  fs::remove(partial + "/b.bin");
  fs::create_symlink(victim_ + "/precious", partial + "/b.bin");

  WeightPuller puller({cache_});
  auto pulled = puller.Pull(server.url(), options_);
  EXPECT_TRUE(ReadAll(victim_ + "/precious") == "precious data") << "the puller wrote through the link";
  ASSERT_FALSE(pulled) << "published " << pulled->dir;
  EXPECT_NE(pulled.error().message().find("b.bin"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("symbolic link"), std::string::npos) << pulled.error().message();
}

TEST_F(CacheSafetyTest, SymlinkAtALockFileIsNotFollowed) {
  WeightPuller puller({cache_});
  auto first = puller.Pull("file://" + src_, options_);
  ASSERT_TRUE(first) << first.error().ToString();
  first->lease.Release();
  std::string lock = cache_ + "/locks/" + OnlyEntry(cache_ + "/locks", ".pull");
  fs::remove(lock);
  fs::create_symlink(victim_ + "/created-by-puller", lock);

  auto second = puller.Pull("file://" + src_, options_);
  EXPECT_FALSE(fs::exists(victim_ + "/created-by-puller")) << "the lock's open followed the link";
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message().find("symbolic link"), std::string::npos) << second.error().message();
}

TEST_F(CacheSafetyTest, SymlinkAtTheMetaFilesTemporaryNameIsReplacedNotWrittenThrough) {
  RangeFileServer server(src_);
  std::string key = LeavePartialDownload(server);
  ASSERT_FALSE(key.empty());
  std::ofstream(victim_ + "/precious", std::ios::binary) << "precious data";
  fs::create_symlink(victim_ + "/precious", cache_ + "/meta/" + key + ".json.tmp");

  WeightPuller puller({cache_});
  auto pulled = puller.Pull(server.url(), options_);
  EXPECT_TRUE(ReadAll(victim_ + "/precious") == "precious data") << "the meta file was written through the link";
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_FALSE(fs::is_symlink(cache_ + "/meta/" + key + ".json"));
}

}  // namespace
}  // namespace moeserve::storage

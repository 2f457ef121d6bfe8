// Object keys and manifest paths that would leave the cache directory are
// refused in every mode, before a byte is fetched: a listing's "../" keys
// (pull --no-verify through an S3 double), absolute paths, backslashes, empty
// segments, NUL, and symbolic links in a file:// source.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/object_key.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "s3_listing_double.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::RangeFileServer;
using testing::S3ListingDouble;

TEST(ObjectKey, PlainRelativePathsPass) {
  for (const char* key : {"a.bin", "model-00001-of-00002.safetensors", "sub/dir/x.json", ".gitattributes",
                          "dir.with.dots/..hidden", "a b/c%20d", "unicode-\xc3\xa9.bin"})
    EXPECT_TRUE(CheckObjectKey(key)) << key;
}

TEST(ObjectKey, EachRuleRefusesWithTheKeyQuoted) {
  const std::pair<std::string, const char*> cases[] = {
      {"", "empty"},
      {"../x", "'..'"},
      {"a/../../x", "'..'"},
      {"a/..", "'..'"},
      {"./x", "'.'"},
      {"a/./x", "'.'"},
      {"/etc/passwd", "absolute"},
      {"a//b", "empty path segment"},
      {"a/", "empty path segment"},
      {"a\\..\\b", "backslash"},
      {std::string("a\0b", 3), "NUL"},
      {"a\tb", "control"},
      {std::string(1025, 'a'), "1024"},
      {std::string(256, 'a') + "/x", "255"},
      {".pull/progress.bin", ".pull"},
      {"manifest.json", "manifest.json"},
  };
  for (const auto& [key, why] : cases) {
    Status s = CheckObjectKey(key);
    ASSERT_FALSE(s) << key;
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message().find(why), std::string::npos) << s.error().message();
  }
  EXPECT_NE(CheckObjectKey(std::string("a\0b", 3)).error().message().find("'a\\x00b'"), std::string::npos)
      << "a NUL is shown, not cut at";
}

TEST(ObjectKey, ManifestPathsListedTwiceOrAsFileAndFolderAreRefused) {
  engine::Manifest twice{{{"a.bin", 1, ""}, {"b.bin", 1, ""}, {"a.bin", 1, ""}}};
  Status s = CheckManifestPaths(twice, "m.json");
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("'a.bin' is listed twice"), std::string::npos) << s.error().message();
  // "a-x" sorts between "a" and "a/b": the check must not rely on neighbours.
  engine::Manifest both{{{"a", 1, ""}, {"a-x", 1, ""}, {"a/b", 1, ""}}};
  s = CheckManifestPaths(both, "m.json");
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message().find("'a' is listed as a file and as the folder of 'a/b'"), std::string::npos)
      << s.error().message();
  engine::Manifest fine{{{"a/b", 1, ""}, {"a/c", 1, ""}, {"ab", 1, ""}}};
  EXPECT_TRUE(CheckManifestPaths(fine, "m.json"));
}

class PathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = MakeTempDir("paths-cache");
    victim_ = MakeTempDir("paths-victim");
    options_.revision = "r";
    options_.log_progress = false;
    options_.connections = 2;
    options_.retry.base_delay = std::chrono::milliseconds(5);
    options_.retry.max_attempts = 2;
    options_.source.credentials = AwsCredentials{"AKIDEXAMPLE", "secret", ""};
  }
  void TearDown() override {
    fs::remove_all(cache_);
    fs::remove_all(victim_);
  }
  // A key that, joined to partial/<key>/, lands in victim_ (a sibling of the cache).
  std::string Escaping(const std::string& name) const {
    return "../../../" + fs::path(victim_).filename().string() + "/" + name;
  }
  std::string cache_, victim_;
  PullOptions options_;
};

TEST_F(PathsTest, NoVerifyListingWithDotDotKeysWritesNothingOutsideTheCache) {
  S3ListingDouble s3("models", {{"nov/config.json", "{}"}, {"nov/" + Escaping("planted.bin"), "attacker bytes"}});
  options_.verify = false;
  options_.source.endpoint_url = s3.endpoint();
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/nov/", options_);
  EXPECT_FALSE(fs::exists(victim_ + "/planted.bin")) << "written outside the cache";
  ASSERT_FALSE(pulled) << "pulled into " << pulled->dir;
  EXPECT_EQ(pulled.error().code(), ErrorCode::kInvalidArgument) << pulled.error().ToString();
  EXPECT_NE(pulled.error().message().find("planted.bin"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find(".."), std::string::npos) << pulled.error().message();
  EXPECT_GE(s3.lists(), 1) << "the refusal comes from the listing";
  EXPECT_EQ(s3.object_gets(), 0) << "refused before any object was fetched";
  EXPECT_TRUE(fs::is_empty(victim_));
}

// Every shape of key that is not a plain relative path below the target. (A key
// ending in '/' is a folder marker, which listings skip, so it is not here.)
TEST_F(PathsTest, NoVerifyListingRefusesEveryUnsafeKeyShape) {
  const std::vector<std::string> bad = {
      "../outside.bin",      // parent
      "sub/../../outside",   // parent after a segment
      "sub/..",              // ends in ..
      "./a.bin",             // dot segment
      "/etc/cron.d/x",       // absolute ("nov/" + "/etc/..." after the prefix)
      "sub//a.bin",          // empty segment
      "sub/new\nline.bin",   // a control character (S3 allows it; logs and shells do not)
      "..\\outside.bin",     // backslash (a separator elsewhere, a trap to carry)
      ".pull/progress.bin",  // the puller's own resume state
      "manifest.json/x",     // under the name the puller writes itself
  };
  WeightPuller puller({cache_});
  options_.verify = false;
  int i = 0;
  for (const auto& key : bad) {
    SCOPED_TRACE(key);
    S3ListingDouble s3("models", {{"nov/ok.bin", "fine"}, {"nov/" + key, "attacker bytes"}});
    options_.source.endpoint_url = s3.endpoint();
    options_.revision = "r" + std::to_string(i++);
    auto pulled = puller.Pull("s3://models/nov/", options_);
    EXPECT_FALSE(pulled) << "pulled into " << pulled->dir;
    if (!pulled) {
      EXPECT_EQ(pulled.error().code(), ErrorCode::kInvalidArgument) << pulled.error().ToString();
    }
    EXPECT_EQ(s3.object_gets(), 0);
  }
  EXPECT_TRUE(fs::is_empty(victim_));
}

TEST_F(PathsTest, ListingKeyOutsideTheRequestedPrefixIsRefused) {
  // ListObjectsV2 with prefix=nov/ returns only keys under it; one that is not
  // must not be cut to a path by the prefix's length ("other/../x" -> "r/../x").
  S3ListingDouble s3("models", {{"nov/ok.bin", "fine"}, {"zzz/x.bin", "elsewhere"}});
  options_.verify = false;
  options_.source.endpoint_url = s3.endpoint();
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/nov/", options_);
  ASSERT_FALSE(pulled) << "pulled into " << pulled->dir;
  EXPECT_NE(pulled.error().message().find("zzz/x.bin"), std::string::npos) << pulled.error().message();
  EXPECT_EQ(s3.object_gets(), 0);
}

// A manifest is parsed by the engine (which refuses ".." and absolute paths);
// the shapes it lets through must still not reach the file system as given.
TEST_F(PathsTest, ManifestPathsWithNulBackslashOrEmptySegmentsAreRefused) {
  std::string src = MakeTempDir("paths-src");
  std::ofstream(src + "/w.bin") << "weights";
  fs::create_directories(src + "/sub");
  std::ofstream(src + "/sub/w.bin") << "weights";
  // The true hash: a puller that let these paths through would succeed.
  std::string sha = Sha256Hex("weights");
  const std::vector<std::string> bad = {"w.bin\\u0000/../../x", "w.bin\\u0000evil", "sub\\\\..\\\\w.bin", "sub//w.bin",
                                        "w.bin/", ".pull/plan.json", "manifest.json"};
  RangeFileServer server(src);
  WeightPuller puller({cache_});
  int i = 0;
  for (const auto& path : bad) {
    SCOPED_TRACE(path);
    std::ofstream(src + "/manifest.json", std::ios::trunc)
        << R"({"files":[{"path":")" << path << R"(","size":7,"sha256":")" << sha << R"("}]})";
    options_.revision = "m" + std::to_string(i++);
    for (const std::string& uri : {"file://" + src, server.url()}) {
      SCOPED_TRACE(uri);
      auto pulled = puller.Pull(uri, options_);
      EXPECT_FALSE(pulled) << "pulled into " << pulled->dir;
      if (!pulled) {
        EXPECT_TRUE(pulled.error().code() == ErrorCode::kInvalidArgument ||
                    pulled.error().code() == ErrorCode::kCorruption)
            << pulled.error().ToString();
      }
    }
  }
  EXPECT_FALSE(fs::exists(cache_ + "/x"));
  fs::remove_all(src);
}

TEST_F(PathsTest, DuplicateManifestPathsAreRefused) {
  std::string src = MakeTempDir("paths-src");
  std::ofstream(src + "/w.bin") << "weights";
  std::string sha = Sha256Hex("weights");
  std::ofstream(src + "/manifest.json") << R"({"files":[{"path":"w.bin","size":7,"sha256":")" << sha
                                        << R"("},{"path":"w.bin","size":7,"sha256":")" << sha << R"("}]})";
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("file://" + src, options_);
  ASSERT_FALSE(pulled);
  EXPECT_NE(pulled.error().message().find("w.bin"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("twice"), std::string::npos) << pulled.error().message();
  fs::remove_all(src);
}

// A file:// source with a symbolic link to a node file: an unverified pull
// would copy the node's file into the cache, where a tenant's pod reads it.
TEST_F(PathsTest, SymlinkInAFileSourceIsNotFollowed) {
  std::string src = MakeTempDir("paths-src");
  std::ofstream(src + "/ok.bin") << "fine";
  std::ofstream(victim_ + "/secret") << "node secret";
  fs::create_symlink(victim_ + "/secret", src + "/w.bin");
  options_.verify = false;
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("file://" + src, options_);
  ASSERT_FALSE(pulled) << "pulled into " << pulled->dir;
  EXPECT_NE(pulled.error().message().find("w.bin"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("symbolic link"), std::string::npos) << pulled.error().message();

  // A directory symlink on the way to a manifest's file is refused too.
  fs::remove(src + "/w.bin");
  fs::create_directory(victim_ + "/d");
  std::ofstream(victim_ + "/d/w.bin") << "node secret";
  fs::create_directory_symlink(victim_ + "/d", src + "/sub");
  std::ofstream(src + "/manifest.json")
      << R"({"files":[{"path":"sub/w.bin","size":11,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"}]})";
  options_.verify = true;
  auto verified = puller.Pull("file://" + src, options_);
  ASSERT_FALSE(verified);
  EXPECT_NE(verified.error().message().find("symbolic link"), std::string::npos) << verified.error().message();
  fs::remove_all(src);
}

}  // namespace
}  // namespace moeserve::storage

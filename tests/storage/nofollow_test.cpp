// storage.nofollow: the cache's file primitives never follow a link planted
// below the directory they start from (a tenant's pod may write into a shared
// node cache): opening through a link, reading or writing through one, or
// removing a tree that holds one, must neither reach nor change what the
// link points at.
#include "moeserve/storage/nofollow.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;

// A fresh directory under TMPDIR with `cache/` (where the primitives work)
// and `outside/secret` (what a planted link points at).
class NoFollow : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") / "nofollow.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ / "cache" / "models");
    fs::create_directories(root_ / "outside");
    std::ofstream(root_ / "outside" / "secret") << "do not touch";
    auto dir = OpenDirectory((root_ / "cache").string(), false);
    ASSERT_TRUE(dir) << dir.error().message();
    cache_ = std::move(*dir);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Secret() const {
    std::ifstream in(root_ / "outside" / "secret");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path root_;
  UniqueFd cache_;
};

TEST_F(NoFollow, ALinkOnTheWayIsRefusedNamingIt) {
  fs::create_directory_symlink(root_ / "outside", root_ / "cache" / "models" / "k");
  auto dir = OpenDirectoryAt(cache_.get(), "models/k", false, "cache/models/k");
  ASSERT_FALSE(dir);
  EXPECT_EQ(dir.error().code(), ErrorCode::kPermissionDenied) << dir.error().message();
  auto file = OpenFileAt(cache_.get(), "models/k/secret", O_RDONLY, "cache/models/k/secret");
  ASSERT_FALSE(file);
  EXPECT_EQ(file.error().code(), ErrorCode::kPermissionDenied) << file.error().message();
  // Creating below the link must not create anything in its target.
  EXPECT_FALSE(OpenFileAt(cache_.get(), "models/k/new", O_RDWR | O_CREAT, "cache/models/k/new"));
  EXPECT_FALSE(fs::exists(root_ / "outside" / "new"));
}

TEST_F(NoFollow, AFileLinkIsNeitherReadNorWrittenThrough) {
  fs::create_symlink(root_ / "outside" / "secret", root_ / "cache" / "meta.json");
  auto read = ReadFileAt(cache_.get(), "meta.json", 1 << 20, "cache/meta.json");
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().code(), ErrorCode::kPermissionDenied) << read.error().message();
  // WriteFileAt replaces the name: the link goes, its target stays as it was.
  ASSERT_TRUE(WriteFileAt(cache_.get(), "meta.json", "{}", "cache/meta.json"));
  EXPECT_EQ(Secret(), "do not touch");
  EXPECT_FALSE(fs::is_symlink(root_ / "cache" / "meta.json"));
  auto back = ReadFileAt(cache_.get(), "meta.json", 1 << 20, "cache/meta.json");
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(*back, "{}");
  // A link planted at the temporary name is removed, not written through.
  fs::create_symlink(root_ / "outside" / "secret", root_ / "cache" / "meta.json.tmp");
  ASSERT_TRUE(WriteFileAt(cache_.get(), "meta.json", "{\"v\":2}", "cache/meta.json"));
  EXPECT_EQ(Secret(), "do not touch");
}

TEST_F(NoFollow, RemovingATreeRemovesLinksNotTheirTargets) {
  fs::create_directories(root_ / "cache" / "models" / "k" / "sub");
  std::ofstream(root_ / "cache" / "models" / "k" / "sub" / "w.bin") << "12345";
  fs::create_directory_symlink(root_ / "outside", root_ / "cache" / "models" / "k" / "sub" / "escape");
  fs::create_symlink(root_ / "outside" / "secret", root_ / "cache" / "models" / "k" / "s");
  EXPECT_EQ(TreeBytesAt(cache_.get(), "models/k"), 5u) << "links are not counted";
  ASSERT_TRUE(RemoveTreeAt(cache_.get(), "models/k", "cache/models/k"));
  EXPECT_FALSE(fs::exists(root_ / "cache" / "models" / "k"));
  EXPECT_EQ(Secret(), "do not touch");
  EXPECT_TRUE(fs::exists(root_ / "outside"));
  EXPECT_TRUE(RemoveTreeAt(cache_.get(), "models/absent", "cache/models/absent")) << "absent is fine";
}

TEST_F(NoFollow, PlainContentsAreDirectoriesAndRegularFilesOnly) {
  fs::create_directories(root_ / "cache" / "models" / "k");
  std::ofstream(root_ / "cache" / "models" / "k" / "w.bin") << "x";
  EXPECT_TRUE(CheckPlainContents(cache_.get(), "cache"));
  ASSERT_EQ(mkfifo((root_ / "cache" / "models" / "k" / "pipe").c_str(), 0600), 0);
  const Status fifo = CheckPlainContents(cache_.get(), "cache");
  ASSERT_FALSE(fifo);
  EXPECT_EQ(fifo.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(fifo.error().message().find("pipe"), std::string::npos) << fifo.error().message();
  fs::remove(root_ / "cache" / "models" / "k" / "pipe");
  fs::create_symlink(root_ / "outside" / "secret", root_ / "cache" / "models" / "k" / "link");
  const Status link = CheckPlainContents(cache_.get(), "cache");
  ASSERT_FALSE(link);
  EXPECT_NE(link.error().message().find("link"), std::string::npos) << link.error().message();
}

TEST_F(NoFollow, ReadsAreBoundedAndClearEmptiesADirectory) {
  ASSERT_TRUE(WriteFileAt(cache_.get(), "big", std::string(100, 'x'), "cache/big"));
  auto small = ReadFileAt(cache_.get(), "big", 99, "cache/big");
  ASSERT_FALSE(small);
  EXPECT_EQ(small.error().code(), ErrorCode::kResourceExhausted);
  auto exact = ReadFileAt(cache_.get(), "big", 100, "cache/big");
  ASSERT_TRUE(exact);
  EXPECT_EQ(exact->size(), 100u);
  auto missing = ReadFileAt(cache_.get(), "none", 100, "cache/none");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(ClearDirectory(cache_.get(), "cache"));
  EXPECT_TRUE(fs::is_empty(root_ / "cache"));
  EXPECT_EQ(Secret(), "do not touch");
}

}  // namespace
}  // namespace moeserve::storage

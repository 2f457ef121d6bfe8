// The read-bandwidth probe's array size: taken from the last-level cache in
// a sysfs-shaped directory (a fake one here), at least 4x that cache and at
// least 256 MiB.
#include "moeserve/kernels/read_bandwidth.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moeserve::kernels {
namespace {

namespace fs = std::filesystem;

constexpr size_t kKiB = size_t{1} << 10, kMiB = size_t{1} << 20;

class FakeCpuDir {
 public:
  explicit FakeCpuDir(const std::string& tag)
      : dir_(fs::path(::testing::TempDir()) / ("moe_read_bw_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "cache");
  }
  ~FakeCpuDir() { fs::remove_all(dir_); }
  // One cache/indexN entry; an empty field is left out.
  void Add(int index, const std::string& level, const std::string& type, const std::string& size) {
    const fs::path d = dir_ / "cache" / ("index" + std::to_string(index));
    fs::create_directories(d);
    const auto put = [&](const char* name, const std::string& text) {
      if (!text.empty()) std::ofstream(d / name) << text << "\n";
    };
    put("level", level);
    put("type", type);
    put("size", size);
  }
  std::string path() const { return dir_.string(); }

 private:
  fs::path dir_;
};

// An EPYC core's caches as sysfs lists them (this machine's, L3 32 MiB).
void AddEpyc(FakeCpuDir& d) {
  d.Add(0, "1", "Data", "48K");
  d.Add(1, "1", "Instruction", "32K");
  d.Add(2, "2", "Unified", "1024K");
  d.Add(3, "3", "Unified", "32768K");
}

TEST(LastLevelCache, HighestLevelWins) {
  FakeCpuDir d("epyc");
  AddEpyc(d);
  EXPECT_EQ(LastLevelCacheBytes(d.path()), 32 * kMiB);
  // 4 x 32 MiB is under the floor.
  EXPECT_EQ(ProbeArrayMiB(d.path()), 256u);
}

TEST(LastLevelCache, LargeCacheSetsTheArray) {
  // Some machines here report a 480 MiB last-level cache: the array is 4x it.
  FakeCpuDir d("large");
  d.Add(0, "1", "Data", "48K");
  d.Add(1, "2", "Unified", "2048K");
  d.Add(2, "3", "Unified", "480M");
  EXPECT_EQ(LastLevelCacheBytes(d.path()), 480 * kMiB);
  EXPECT_EQ(ProbeArrayMiB(d.path()), 1920u);
}

TEST(LastLevelCache, OrderOfIndicesDoesNotMatter) {
  FakeCpuDir d("order");
  d.Add(0, "3", "Unified", "96M");
  d.Add(1, "1", "Data", "48K");
  d.Add(2, "2", "Unified", "1M");
  EXPECT_EQ(LastLevelCacheBytes(d.path()), 96 * kMiB);
  EXPECT_EQ(ProbeArrayMiB(d.path()), 384u);
}

TEST(LastLevelCache, InstructionCachesAndUnreadableEntriesAreSkipped) {
  FakeCpuDir d("skip");
  d.Add(0, "1", "Data", "32K");
  d.Add(1, "2", "Unified", "512K");
  d.Add(2, "4", "Instruction", "900M");  // never the data's ceiling
  d.Add(3, "3", "Unified", "");           // no size file
  d.Add(4, "3", "Unified", "lots");       // unparsable
  d.Add(5, "", "Unified", "700M");        // no level
  EXPECT_EQ(LastLevelCacheBytes(d.path()), 512 * kKiB);
}

TEST(LastLevelCache, SizesInBytesAndPartialMiBRoundUp) {
  FakeCpuDir d("bytes");
  d.Add(0, "3", "Unified", std::to_string(100 * kMiB + 1));
  EXPECT_EQ(LastLevelCacheBytes(d.path()), 100 * kMiB + 1);
  // 101 MiB rounded up, times 4.
  EXPECT_EQ(ProbeArrayMiB(d.path()), 404u);
}

TEST(LastLevelCache, NoCacheDirectoryFallsBackToTheFloor) {
  const std::string missing = ::testing::TempDir() + "/moe_read_bw_missing_" + std::to_string(::getpid());
  fs::remove_all(missing);
  EXPECT_EQ(LastLevelCacheBytes(missing), 0u);
  EXPECT_EQ(ProbeArrayMiB(missing), 256u);
  FakeCpuDir empty("empty");
  EXPECT_EQ(LastLevelCacheBytes(empty.path()), 0u);
  EXPECT_EQ(ProbeArrayMiB(empty.path()), 256u);
}

TEST(ReadBandwidthProbe, ReportsItsArraySize) {
  // The size every caller prints beside its bandwidth.
  const ReadBandwidth r = MeasureReadBandwidth(8, 0.0, 1);
  EXPECT_EQ(r.passes, 1);
  EXPECT_GT(r.array_bytes, 7 * kMiB);
  EXPECT_LE(r.array_bytes, 8 * kMiB);
}

}  // namespace
}  // namespace moeserve::kernels

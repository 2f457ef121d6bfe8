// A Kubernetes Secret volume laid out as the kubelet's atomic writer lays it
// out: each version in its own `..<timestamp>` directory, `..data` a symlink
// to the current one (replaced by rename(2) of a `..data_tmp` symlink), and
// each file a symlink through `..data`. Tests publish versions into it the
// way the kubelet does when a Secret changes.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace moeserve::daemon::testing {

class SecretVolume {
 public:
  SecretVolume()
      : dir_(std::filesystem::path(::testing::TempDir()) /
             ("moe-secret-volume-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~SecretVolume() { std::filesystem::remove_all(dir_); }

  // Writes a new version (file name -> content) and swaps ..data to it: the
  // new timestamped directory, a ..data_tmp symlink renamed over ..data, the
  // user-visible symlinks (first time only), then the old directory goes.
  void Publish(const std::map<std::string, std::string>& files) {
    namespace fs = std::filesystem;
    const std::string version =
        "..2026_12_03_23_" + std::to_string(10 + serial_ % 50) + "_00." + std::to_string(100000000 + serial_);
    ++serial_;
    fs::create_directories(dir_ / version);
    for (const auto& [name, text] : files) std::ofstream(dir_ / version / name) << text;
    fs::remove(dir_ / "..data_tmp");
    fs::create_directory_symlink(version, dir_ / "..data_tmp");
    fs::rename(dir_ / "..data_tmp", dir_ / "..data");
    for (const auto& [name, text] : files)
      if (!fs::is_symlink(dir_ / name)) fs::create_symlink("..data/" + name, dir_ / name);
    if (!current_.empty()) fs::remove_all(dir_ / current_);
    current_ = version;
  }
  void Publish(const std::string& name, const std::string& text) { Publish({{name, text}}); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string current_;
  int serial_ = 0;
};

}  // namespace moeserve::daemon::testing

// What bench_long_prefill and bench_long_decode share: lengths written as
// "32K" or "1M" (and lists of them), and the `long` preset (model_config.cpp) generated into a
// temporary directory when no --model is given, removed when done.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "moeserve/engine/model.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/model_gen.hpp"

namespace moeserve::bench {

// "32K", "1M", "131072" -> tokens; -1 when not a length.
inline int64_t ParseLength(const std::string& s) {
  if (s.empty()) return -1;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  int64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1024, ++end;
  else if (*end == 'M' || *end == 'm') mul = 1 << 20, ++end;
  if (*end != '\0' || v <= 0) return -1;
  return static_cast<int64_t>(v * static_cast<double>(mul));
}

// "4K,64K,1M" -> the lengths; false, after saying which item is not a
// length, when one is not.
inline bool ParseLengths(const std::string& list, std::vector<int64_t>& out) {
  out.clear();
  for (size_t p = 0; p <= list.size();) {
    const size_t q = std::min(list.find(',', p), list.size());
    const int64_t n = ParseLength(list.substr(p, q - p));
    if (n <= 0) {
      std::fprintf(stderr, "--lengths: '%s' is not a length (e.g. 4K,128K,1M)\n", list.substr(p, q - p).c_str());
      return false;
    }
    out.push_back(n);
    p = q + 1;
  }
  return true;
}

// The model at `path`, or the `long` preset (seed 1) generated for the run
// when `path` is empty. Prints why and returns null on failure.
class LongModel {
 public:
  LongModel(const char* who, std::string path, const engine::ModelOptions& options) {
    if (path.empty()) {
      tmp_ = std::filesystem::temp_directory_path() / (std::string(who) + "_" + std::to_string(getpid()));
      engine::ModelGenOptions go;
      go.config = *engine::PresetConfig("long");
      go.seed = 1;
      if (auto st = engine::GenerateModel(go, tmp_.string()); !st) {
        std::fprintf(stderr, "%s: generate: %s\n", who, st.error().ToString().c_str());
        return;
      }
      path = tmp_.string();
    }
    path_ = path;
    auto dir = engine::OpenModelDir(path);
    if (!dir) {
      std::fprintf(stderr, "%s: open: %s\n", who, dir.error().ToString().c_str());
      return;
    }
    auto model = engine::Model::Load(*dir, options);
    if (!model) {
      std::fprintf(stderr, "%s: load: %s\n", who, model.error().ToString().c_str());
      return;
    }
    model_ = std::move(*model);
  }
  ~LongModel() {
    model_.reset();
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_);
  }
  LongModel(const LongModel&) = delete;
  LongModel& operator=(const LongModel&) = delete;

  engine::Model* get() const { return model_.get(); }
  const std::string& path() const { return path_; }

 private:
  std::filesystem::path tmp_;
  std::string path_;
  std::unique_ptr<engine::Model> model_;
};

}  // namespace moeserve::bench

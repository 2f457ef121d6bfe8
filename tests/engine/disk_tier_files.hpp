// The prefix cache's files on disk, for the tests that inspect or damage
// them: the one model folder under a tier's directory, and its .mpc files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace moeserve::engine::testing_util {

inline std::string ModelFolder(const std::string& dir) {
  std::string only;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_directory()) only = e.path().string();
  return only;
}

inline std::vector<std::string> Files(const std::string& folder) {
  std::vector<std::string> out;
  if (folder.empty() || !std::filesystem::exists(folder)) return out;
  for (const auto& e : std::filesystem::directory_iterator(folder))
    if (e.path().extension() == ".mpc") out.push_back(e.path().string());
  return out;
}

}  // namespace moeserve::engine::testing_util

#include "model/machine_memory.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace moeserve::daemon {

namespace {

// The first number in a file ("max" and unreadable files: -1).
int64_t ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return -1;
  try {
    size_t used = 0;
    const long long v = std::stoll(word, &used);
    return used == word.size() && v >= 0 ? static_cast<int64_t>(v) : -1;
  } catch (...) {
    return -1;
  }
}

}  // namespace

MachineMemory ReadMachineMemory(const std::string& meminfo, const std::string& cgroup) {
  MachineMemory m;
  std::ifstream in(meminfo);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    if (fields >> kib) {
      m.available = kib * 1024;
      m.source = "MemAvailable";
    }
  }
  // cgroup v2, then v1 (whose "no limit" is a huge number, which never wins).
  for (const auto& [limit_file, usage_file] : {std::pair{"/memory.max", "/memory.current"},
                                               std::pair{"/memory/memory.limit_in_bytes", "/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = ReadNumber(cgroup + limit_file), usage = ReadNumber(cgroup + usage_file);
    if (limit < 0 || usage < 0) continue;
    const int64_t left = std::max<int64_t>(limit - usage, 0);
    if (m.source.empty() || left < m.available) {
      m.available = left;
      m.source = "cgroup memory.max";
    }
    break;
  }
  return m;
}

int64_t DirectoryBytes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int64_t total = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  return total;
}

int64_t CacheMemoryBudget(int64_t available, int64_t weights, double share) {
  const double free_after = static_cast<double>(std::max<int64_t>(available - weights, 0));
  return static_cast<int64_t>(std::floor(free_after * std::clamp(share, 0.0, 1.0)));
}

}  // namespace moeserve::daemon

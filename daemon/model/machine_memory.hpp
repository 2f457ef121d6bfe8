// How much memory this machine (or the container's cgroup) has free, and the
// KV pool budget an unset `cache_tokens` sizes the pool with: a share
// (`cache_memory_share`) of what is free once the weights are in memory.
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::daemon {

struct MachineMemory {
  int64_t available = 0;  // bytes; 0 when nothing could be read
  std::string source;     // "MemAvailable", or "cgroup memory.max" when that is lower
};

// MemAvailable from `meminfo`, lowered to the cgroup's limit less its usage
// (v2: memory.max and memory.current under `cgroup`; v1:
// memory.limit_in_bytes and memory.usage_in_bytes) when that is lower.
MachineMemory ReadMachineMemory(const std::string& meminfo = "/proc/meminfo",
                                const std::string& cgroup = "/sys/fs/cgroup");

// Bytes of the regular files directly in `dir` (a model directory: its
// weights, which loading brings into memory).
int64_t DirectoryBytes(const std::string& dir);

// share * (available - weights), at least 0.
int64_t CacheMemoryBudget(int64_t available, int64_t weights, double share);

}  // namespace moeserve::daemon

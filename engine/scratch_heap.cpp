// KeepScratchInHeap (scratch_heap.hpp).
#include "scratch_heap.hpp"

#include <malloc.h>

#include <mutex>

#include "moeserve/common/log.hpp"

namespace moeserve::engine {

void KeepScratchInHeap() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    // 32 MiB is glibc's upper bound for the threshold on 64-bit systems
    // (DEFAULT_MMAP_THRESHOLD_MAX): mallopt refuses more.
    constexpr int kMmapThreshold = 32 << 20;
    constexpr int kNeverTrim = -1;  // (size_t)-1: heap tops are kept
    if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 || mallopt(M_TRIM_THRESHOLD, kNeverTrim) != 1)
      log::Warn("engine: the allocator refused to keep scratch memory in the heap; passes pay page faults on it");
#endif
  });
}

}  // namespace moeserve::engine

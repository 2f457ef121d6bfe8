// This machine's memory read bandwidth, as the decode roofline uses it: a
// vectorised sum over an array far larger than the caches, on every thread
// of the kernel pool at once (each reading its own part, four streams each,
// alternately with and without software prefetch).
//
// On a shared machine the bandwidth one gets varies from pass to pass (here
// between about 20 and 70 GB/s, from one millisecond to the next), so both
// the best pass and the mean over the whole measurement are reported: the
// best is the machine's ceiling, the mean what a long run meets on average.
//
// Thread safety: uses DefaultThreadPool(); call from one thread at a time.
#pragma once

#include <cstddef>

namespace moeserve::kernels {

struct ReadBandwidth {
  double best_bytes_per_s = 0;  // the fastest pass
  double mean_bytes_per_s = 0;  // total bytes / total time over all passes
  int passes = 0;
  size_t array_bytes = 0;
};

// Passes over a fresh array of `mib` MiB until `seconds` have passed (at
// least `min_passes`).
ReadBandwidth MeasureReadBandwidth(size_t mib = 1024, double seconds = 1.0, int min_passes = 6);

}  // namespace moeserve::kernels

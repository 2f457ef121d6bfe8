// This machine's memory read bandwidth, as the decode roofline uses it: a
// vectorised sum over an array far larger than the caches, on every thread
// of the kernel pool at once (each reading its own part, four streams each,
// alternately with and without software prefetch).
//
// On a shared machine the bandwidth one gets varies from pass to pass (here
// between about 20 and 80 GB/s, from one millisecond to the next), so the
// best pass, the median pass and the mean over the whole measurement are
// reported: the best is the machine's ceiling, the median its typical pass,
// the mean what a long run meets on average.
//
// Thread safety: uses DefaultThreadPool(); call (and use a probe) from one
// thread at a time.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace moeserve::kernels {

struct ReadBandwidth {
  double best_bytes_per_s = 0;    // the fastest pass
  double median_bytes_per_s = 0;  // the middle pass: robust to the bursts and stalls of a shared machine
  double mean_bytes_per_s = 0;    // total bytes / total time over all passes
  int passes = 0;
  size_t array_bytes = 0;
};

// An array of `mib` MiB, allocated and touched once, whose passes can be
// interleaved with other work: a long run's bandwidth is then measured while
// it runs, in the same conditions, not only around it.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t mib);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // One pass over the array on every pool thread; returns its bytes/s.
  double Pass();
  // Best, median and mean over the passes so far.
  const ReadBandwidth& result() const { return result_; }

 private:
  float* data_ = nullptr;
  size_t bytes_ = 0, part_ = 0, threads_ = 1;
  int passes_ = 0;
  double total_bytes_ = 0, total_s_ = 0;
  std::vector<double> rates_;
  ReadBandwidth result_;
};

// The middle value (the upper middle of an even count); 0 for none.
double MedianOf(std::vector<double> values);

// The size of the highest-level data or unified cache one CPU sees, from
// CPU_DIR/cache/index*/{level,type,size} (sysfs: "32768K", "480M" or bytes);
// 0 when none can be read.
size_t LastLevelCacheBytes(const std::string& cpu_dir = "/sys/devices/system/cpu/cpu0");

// The array size, in MiB, every read-bandwidth probe uses (bench_roofline,
// bench_batch_curve, bench_prefill, moe-run --read-bw auto): a ceiling is
// honest only from an array several times larger than the last-level cache,
// so at least 4x LastLevelCacheBytes(cpu_dir), rounded up to a whole MiB,
// and never under 256 MiB (the floor, too, where no cache size is readable).
size_t ProbeArrayMiB(const std::string& cpu_dir = "/sys/devices/system/cpu/cpu0");

// Passes over a fresh array of `mib` MiB until `seconds` have passed (at
// least `min_passes`).
ReadBandwidth MeasureReadBandwidth(size_t mib = 1024, double seconds = 1.0, int min_passes = 6);

}  // namespace moeserve::kernels

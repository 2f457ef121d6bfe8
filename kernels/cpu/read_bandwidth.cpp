#include "moeserve/kernels/read_bandwidth.hpp"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/weight_memory.hpp"

#include "moeserve/kernels/x86_intrinsics.hpp"

namespace moeserve::kernels {
namespace {

// Four streams per thread, as a 4-row matrix-vector product reads; with
// `prefetch`, each also prefetches 4 KiB ahead into L2, as the MXFP4 kernels
// do (which reads faster on some machines: the ceiling is the better of the
// two; prefetching into L1 instead read ~20 % slower here).
float SumScalar(const float* p, size_t n, bool) {
  float a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t n, bool prefetch) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const size_t q = n / 4 / 16 * 16;
  const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  for (size_t i = 0; i < q; i += 16) {
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p2 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p3 + i + 1024), _MM_HINT_T1);
    }
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p0 + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p1 + i));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p2 + i));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p3 + i));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n, bool prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const size_t q = n / 4 / 8 * 8;
  const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  for (size_t i = 0; i < q; i += 8) {
    if (prefetch && i % 16 == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p2 + i + 1024), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p3 + i + 1024), _MM_HINT_T1);
    }
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p0 + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p1 + i));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p2 + i));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p3 + i));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

volatile float g_sink;

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(size_t mib) {
  ThreadPool& pool = DefaultThreadPool();
  threads_ = static_cast<size_t>(pool.size());
  const size_t n = std::max<size_t>(mib, 1) * (size_t{1} << 20) / sizeof(float);
  part_ = n / threads_ / 64 * 64;
  bytes_ = n * sizeof(float);
  // Huge-page memory like the weights' (weight_memory.hpp): on 4 KiB pages
  // the same sum read ~20 % slower here, which would understate the ceiling.
  data_ = static_cast<float*>(AllocateWeights(bytes_));
  // First touch by the pool, so each part's pages are faulted in (and, on a
  // NUMA machine, placed) by a thread that will read it.
  float* a = data_;
  const size_t part = part_;
  pool.ParallelFor(threads_, [&](size_t t) { std::fill(a + t * part, a + (t + 1) * part, 1.0f); });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { FreeWeights(data_, bytes_); }

double ReadBandwidthProbe::Pass() {
  using Clock = std::chrono::steady_clock;
  // The widest loads the fast kernels use: those of BestIsa's row or of the
  // nearest row down its fallback chain that has a reader here.
  float (*sum)(const float*, size_t, bool) = SumScalar;
#if defined(__x86_64__)
  for (Isa isa = BestIsa(); isa != Isa::kReference; isa = IsaFallback(isa)) {
    if (isa == Isa::kAvx512) sum = SumAvx512;
    else if (isa == Isa::kAvx2) sum = SumAvx2;
    if (sum != SumScalar) break;
  }
#endif
  const bool prefetch = passes_++ % 2 == 1;
  const float* a = data_;
  const size_t part = part_;
  const auto t0 = Clock::now();
  DefaultThreadPool().ParallelFor(threads_, [&](size_t t) { g_sink = sum(a + t * part, part, prefetch); });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double bytes = static_cast<double>(part_ * threads_ * sizeof(float));
  result_.best_bytes_per_s = std::max(result_.best_bytes_per_s, bytes / s);
  total_bytes_ += bytes;
  total_s_ += s;
  result_.passes = passes_;
  result_.array_bytes = part_ * threads_ * sizeof(float);
  result_.mean_bytes_per_s = total_bytes_ / total_s_;
  rates_.push_back(bytes / s);
  result_.median_bytes_per_s = MedianOf(rates_);
  return bytes / s;
}

double MedianOf(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

namespace {

// The first line of a small sysfs file, blanks trimmed; empty when unreadable.
std::string ReadLine(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string s;
  if (!in || !std::getline(in, s)) return "";
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// "32768K", "480M", "1G" or a byte count; 0 for anything else.
size_t ParseCacheSize(const std::string& s) {
  size_t i = 0, v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (v > (SIZE_MAX - 9) / 10) return 0;
    v = v * 10 + static_cast<size_t>(s[i++] - '0');
  }
  if (i == 0) return 0;
  size_t unit = 1;
  if (i < s.size()) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(s[i++])));
    if (c == 'K') unit = size_t{1} << 10;
    else if (c == 'M') unit = size_t{1} << 20;
    else if (c == 'G') unit = size_t{1} << 30;
    else return 0;
    if (i < s.size() && (s[i] == 'B' || s[i] == 'b')) ++i;  // "32768KB"
  }
  if (i != s.size() || v > SIZE_MAX / unit) return 0;
  return v * unit;
}

}  // namespace

size_t LastLevelCacheBytes(const std::string& cpu_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(fs::path(cpu_dir) / "cache", ec);
  if (ec) return 0;
  int best_level = 0;
  size_t best = 0;
  for (const fs::directory_entry& e : it) {
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    if (ReadLine(e.path() / "type") == "Instruction") continue;
    const std::string level_text = ReadLine(e.path() / "level");
    if (level_text.empty() || level_text.size() > 2 ||
        !std::all_of(level_text.begin(), level_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const int level = std::stoi(level_text);
    const size_t size = ParseCacheSize(ReadLine(e.path() / "size"));
    if (size == 0) continue;
    if (level > best_level || (level == best_level && size > best)) best_level = level, best = size;
  }
  return best;
}

size_t ProbeArrayMiB(const std::string& cpu_dir) {
  constexpr size_t kFloorMiB = 256, kTimesLlc = 4, kMiB = size_t{1} << 20;
  const size_t llc = LastLevelCacheBytes(cpu_dir);
  return std::max(kFloorMiB, (llc / kMiB + (llc % kMiB != 0)) * kTimesLlc);
}

ReadBandwidth MeasureReadBandwidth(size_t mib, double seconds, int min_passes) {
  using Clock = std::chrono::steady_clock;
  ReadBandwidthProbe probe(mib);
  const auto start = Clock::now();
  while (probe.result().passes < min_passes || std::chrono::duration<double>(Clock::now() - start).count() < seconds)
    probe.Pass();
  return probe.result();
}

}  // namespace moeserve::kernels

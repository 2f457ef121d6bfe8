// This machine's ceilings and the kernels' fraction of them:
//  - read bandwidth: kernels::MeasureReadBandwidth (a vectorised sum over an
//    array far larger than the caches, on every core at once; its size is
//    kernels::ProbeArrayMiB(), at least 4x the last-level cache and 256 MiB,
//    the size bench_batch_curve, bench_prefill and moe-run --read-bw auto
//    use too), the best pass before or after the kernels. A pass
//    then lasts a few milliseconds, as the kernels' timed runs do: on a
//    machine whose bandwidth moves from moment to moment, the best of many
//    short runs is compared with the best of many short passes (with 1 GiB
//    passes of ~30 ms, kernels' best 2 ms runs read up to 120 % of it);
//  - fp32 FMA peak: independent FMA chains in registers on every core (and,
//    with --ceilings, the BF16 dot-product peak; both in peaks.hpp);
//  then the MXFP4 matmul at batch 1 (vs bandwidth) and batch 512 (vs FMA
//  peak) at flagship-like shapes, and the F32 and BF16 matvecs (vs bandwidth).
// Usage: bench_roofline [--ceilings] [--mib N]
//   --ceilings prints only "read_bw_GBps=... fma_peak_GFLOPs=... read_bw_array_MiB=..." (for scripts/bench).
//   --mib N: another probe size than ProbeArrayMiB() (the output says which).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../kernels/shapes.hpp"
#include "peaks.hpp"
#include "moeserve/kernels/bf16_matmul.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/mxfp4_activation_bits.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/x86_intrinsics.hpp"

namespace mb = moeserve::bench;
namespace mk = moeserve::kernels;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

using mb::FmaPeak;

struct Timing {
  double best_s = 1e30, mean_s = 0;
  // With a probe: the read bandwidth of the passes interleaved with the runs
  // (one before each), so that kernel and ceiling meet the same moments of a
  // shared machine whose bandwidth moves from one second to the next.
  double window_best_bps = 0, window_mean_bps = 0;
  // Medians of the runs and of the interleaved passes: unmoved by a burst
  // (a neighbour going idle lifted single passes to 60-80 GB/s against a
  // typical 35-45) or by a stall, which sway best and mean.
  double median_s = 0, window_median_bps = 0;
};

template <class Fn>
Timing Runs(int reps, mk::ReadBandwidthProbe* probe, Fn fn) {
  Timing t;
  double total = 0, inverse_rates = 0;
  std::vector<double> run_s, pass_bps;
  for (int r = 0; r < reps; ++r) {
    if (probe) {
      const double rate = probe->Pass();
      t.window_best_bps = std::max(t.window_best_bps, rate);
      inverse_rates += 1.0 / rate;
      pass_bps.push_back(rate);
    }
    const auto a = Clock::now();
    fn();
    const double s = Seconds(a, Clock::now());
    t.best_s = std::min(t.best_s, s);
    total += s;
    run_s.push_back(s);
  }
  t.mean_s = total / reps;
  t.median_s = mk::MedianOf(run_s);
  if (probe) {
    t.window_mean_bps = reps / inverse_rates;  // equal bytes a pass: the harmonic mean
    t.window_median_bps = mk::MedianOf(pass_bps);
  }
  return t;
}

// /proc/loadavg's first three fields ("?" where it cannot be read).
std::string LoadAverage() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "?";
  char buf[128] = {0};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  if (!ok) return "?";
  std::string s(buf);
  size_t cut = 0;
  for (int fields = 0; fields < 3 && cut != std::string::npos; ++fields) cut = s.find(' ', cut + (fields ? 1 : 0));
  return s.substr(0, cut);
}

}  // namespace

int main(int argc, char** argv) {
  bool ceilings_only = false;
  size_t mib = mk::ProbeArrayMiB();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ceilings")) ceilings_only = true;
    else if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
  }
  const int threads = mk::DefaultThreadPool().size();
  const bool avx512 = mk::IsaSupported(mk::Isa::kAvx512);
  if (!mk::IsaSupported(mk::Isa::kAvx2)) {
    std::printf("roofline needs AVX2\n");
    return 0;
  }
  // The machine may be shared: its load, before and after, beside the figures.
  const std::string load_before = LoadAverage();
  const mk::ReadBandwidth before = mk::MeasureReadBandwidth(mib, 1.0, 12);
  const double bw = before.best_bytes_per_s;
  const double peak = FmaPeak(threads, avx512);
  if (ceilings_only) {
    // The BF16 dot-product peak (vdpbf16ps; 0 without avx512_bf16): the
    // ceiling of the BF16 GEMM rows.
    std::printf("read_bw_GBps=%.2f read_bw_mean_GBps=%.2f fma_peak_GFLOPs=%.2f bf16_dot_peak_GFLOPs=%.2f threads=%d "
                "read_bw_array_MiB=%zu\n",
                bw / 1e9, before.mean_bytes_per_s / 1e9, peak / 1e9, mb::Bf16DotPeak(threads) / 1e9, threads,
                before.array_bytes >> 20);
    return 0;
  }
  struct Row {
    std::string name;
    double sec, bps, fps;
    bool memory_bound;
    double mean_bps = 0, window_best_bps = 0, window_mean_bps = 0;
    double median_bps = 0, window_median_bps = 0;
  };
  mk::ReadBandwidthProbe probe(mib);
  std::vector<Row> rows;
  const mk::Isa isa = mk::BestIsa();
  const mk::KernelSet& k = mk::Kernels(isa);
  for (const auto& s : mb::kMxfp4Shapes) {
    // Batch 1 cycles through enough weight copies that every run reads its
    // weights from memory (as decode does: each expert's weights once a step).
    const size_t copies = mb::ColdCopies(mb::Mxfp4Bytes(s.out, s.in, 0));
    std::vector<mb::Mxfp4Matrix> ms;
    for (size_t c = 0; c < copies; ++c) ms.push_back(mb::RandomMxfp4(s.out, s.in, static_cast<uint32_t>(c + 1)));
    for (size_t n : {size_t{1}, size_t{512}}) {
      std::vector<float> x = mb::RandomFloats(n * s.in), y(n * s.out);
      size_t next = 0;
      const Timing t = Runs(n == 1 ? 3 * static_cast<int>(copies) : 4, n == 1 ? &probe : nullptr, [&] {
        const mb::Mxfp4Matrix& m = ms[next++ % copies];
        k.matmul_mxfp4(m.view(), x.data(), n, y.data());
      });
      const double bytes = mb::Mxfp4Bytes(s.out, s.in, n);
      rows.push_back({std::string("mxfp4_matmul ") + s.name + " n=" + std::to_string(n) + " (" + mk::IsaName(isa) +
                          ")",
                      t.best_s, bytes / t.best_s, mb::MatMulFlops(s.out, s.in, n) / t.best_s, n == 1,
                      bytes / t.mean_s, t.window_best_bps, t.window_mean_bps, bytes / t.median_s, t.window_median_bps});
    }
    // The decode form with fewer activation bits (KernelsWithDecodeActivationBits):
    // 16 and 8 bits, 4 and 2 vpdpbusd per line of codes against the default's 6.
    for (int bits : {16, 8}) {
      const mk::KernelSet& kb = mk::KernelsWithDecodeActivationBits(isa, bits);
      std::vector<float> x = mb::RandomFloats(s.in), y(s.out);
      size_t next = 0;
      const Timing t = Runs(3 * static_cast<int>(copies), &probe, [&] {
        kb.matmul_mxfp4(ms[next++ % copies].view(), x.data(), 1, y.data());
      });
      const double bytes = mb::Mxfp4Bytes(s.out, s.in, 1);
      rows.push_back({std::string("mxfp4_matmul ") + s.name + " n=1 act" + std::to_string(bits) + " (" +
                          mk::IsaName(isa) + ")",
                      t.best_s, bytes / t.best_s, mb::MatMulFlops(s.out, s.in, 1) / t.best_s, true, bytes / t.mean_s,
                      t.window_best_bps, t.window_mean_bps, bytes / t.median_s, t.window_median_bps});
    }
    // The same sets at batch 512: integer products over tiles of rows
    // (mxfp4_gemm_vnni.cpp), against the fp32 FMA peak in equivalent work.
    for (int bits : {16, 8}) {
      const mk::KernelSet& kb = mk::KernelsWithDecodeActivationBits(isa, bits);
      const size_t n = 512;
      std::vector<float> x = mb::RandomFloats(n * s.in), y(n * s.out);
      const Timing t = Runs(4, nullptr, [&] { kb.matmul_mxfp4(ms[0].view(), x.data(), n, y.data()); });
      const double bytes = mb::Mxfp4Bytes(s.out, s.in, n);
      rows.push_back({std::string("mxfp4_matmul ") + s.name + " n=512 act" + std::to_string(bits) + " (" +
                          mk::IsaName(isa) + ")",
                      t.best_s, bytes / t.best_s, mb::MatMulFlops(s.out, s.in, n) / t.best_s, false, bytes / t.mean_s,
                      t.window_best_bps, t.window_mean_bps, bytes / t.median_s, t.window_median_bps});
    }
  }
  {
    const size_t out = 4096, in = 4096;
    const size_t copies = mb::ColdCopies(4.0 * out * in);
    std::vector<std::vector<float>> ws;
    for (size_t c = 0; c < copies; ++c) ws.push_back(mb::RandomFloats(out * in, static_cast<uint32_t>(c + 3)));
    std::vector<float> x = mb::RandomFloats(in), y(out);
    size_t next = 0;
    const Timing t = Runs(3 * static_cast<int>(copies), &probe, [&] {
      k.matmul_f32(ws[next++ % copies].data(), out, in, x.data(), 1, y.data());
    });
    const double bytes = 4.0 * static_cast<double>(out * in + in);
    rows.push_back({"f32_matmul 4096x4096 n=1", t.best_s, bytes / t.best_s, 2.0 * out * in / t.best_s, true,
                    bytes / t.mean_s, t.window_best_bps, t.window_mean_bps, bytes / t.median_s, t.window_median_bps});
  }
  {
    // The dense layers' decode kernel (most of a small-preset decode step's
    // bytes): BF16 weights, one activation row.
    const size_t out = 4096, in = 4096;
    const size_t copies = mb::ColdCopies(2.0 * out * in);
    std::vector<std::vector<uint16_t>> ws;
    for (size_t c = 0; c < copies; ++c) {
      const std::vector<float> f = mb::RandomFloats(out * in, static_cast<uint32_t>(c + 5));
      std::vector<uint16_t> w(f.size());
      for (size_t i = 0; i < f.size(); ++i) {
        uint32_t b;
        std::memcpy(&b, &f[i], 4);
        w[i] = static_cast<uint16_t>(b >> 16);
      }
      ws.push_back(std::move(w));
    }
    std::vector<float> x = mb::RandomFloats(in), y(out);
    size_t next = 0;
    const Timing t = Runs(3 * static_cast<int>(copies), &probe, [&] {
      k.matmul_bf16(ws[next++ % copies].data(), out, in, x.data(), 1, y.data());
    });
    const double bytes = 2.0 * static_cast<double>(out * in);
    rows.push_back({"bf16_matmul 4096x4096 n=1", t.best_s, bytes / t.best_s, 2.0 * out * in / t.best_s, true,
                    bytes / t.mean_s, t.window_best_bps, t.window_mean_bps, bytes / t.median_s, t.window_median_bps});
  }
  // Measured again after the kernels, the higher kept (for --ceilings'
  // callers and as context: the memory-bound rows use their own window).
  const mk::ReadBandwidth after = mk::MeasureReadBandwidth(mib, 1.0, 12);
  const double ceiling_bw = std::max(bw, after.best_bytes_per_s);
  // Likewise the FMA peak: a busy moment (another tenant on the core) once
  // measured half of it and put the batch-512 kernels at 140 %.
  const double peak_after = FmaPeak(threads, avx512);
  const double ceiling_peak = std::max(peak, peak_after);
  std::printf("ceilings (%d threads, %s): read bandwidth %.2f GB/s (best pass of %.2f before and %.2f after the "
              "kernels; mean over all passes %.2f / %.2f GB/s; passes over %zu MiB), fp32 FMA peak %.1f GFLOP/s (the higher of "
              "%.1f before and %.1f after)\n",
              threads, avx512 ? "avx512" : "avx2", ceiling_bw / 1e9, bw / 1e9, after.best_bytes_per_s / 1e9,
              before.mean_bytes_per_s / 1e9, after.mean_bytes_per_s / 1e9, before.array_bytes >> 20, ceiling_peak / 1e9, peak / 1e9, peak_after / 1e9);
  std::printf("loadavg before: %s; after: %s\n", load_before.c_str(), LoadAverage().c_str());
  std::printf("memory-bound rows: best run against the best probe pass interleaved with the runs; median against median "
              "and mean against mean in the same window\n");
  std::printf("%-34s %9s %9s %9s %9s  %s\n", "kernel (active isa)", "ms", "GB/s", "GFLOP/s", "fraction", "ceiling");
  for (const Row& r : rows) {
    if (r.memory_bound)
      std::printf("%-34s %9.3f %9.2f %9.2f %8.1f%%  read bw %.2f GB/s (same window; median %.2f vs %.2f GB/s: %.1f%%; "
                  "mean %.2f vs %.2f GB/s: %.1f%%)\n",
                  r.name.c_str(), r.sec * 1e3, r.bps / 1e9, r.fps / 1e9, 100.0 * r.bps / r.window_best_bps,
                  r.window_best_bps / 1e9, r.median_bps / 1e9, r.window_median_bps / 1e9,
                  100.0 * r.median_bps / r.window_median_bps, r.mean_bps / 1e9, r.window_mean_bps / 1e9,
                  100.0 * r.mean_bps / r.window_mean_bps);
    else
      std::printf("%-34s %9.3f %9.2f %9.2f %8.1f%%  fma peak %.1f GFLOP/s\n", r.name.c_str(), r.sec * 1e3, r.bps / 1e9,
                  r.fps / 1e9, 100.0 * r.fps / ceiling_peak, ceiling_peak / 1e9);
  }
  return 0;
}

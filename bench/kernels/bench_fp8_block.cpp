// Google Benchmark for the FP8 block-scaled products (fp8_block.hpp,
// matmul_fp8_block) at a DeepSeek-V3-like shape larger than the last-level
// cache (18432 x 7168 E4M3 codes, 132 MB, so every pass reads its weights
// from memory), on every set this CPU runs except the single-threaded
// reference, at 1 activation row (decode) and 8 (a batched decode step);
// and at 128 x 7168 (in cache: the compute rate, without the probe).
//
// Counters: weight_GB/s (code and scale bytes read per second of the
// product's own time, manual timing), and the same run's memory read
// ceiling: a ReadBandwidthProbe over kernels::ProbeArrayMiB() MiB, one pass
// between every two products (the machine is shared; the ceiling is measured
// in the same conditions), best and median pass, and the product's rate as a
// fraction of each.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"

namespace mk = moeserve::kernels;

namespace {

constexpr size_t kRows = 18432, kCols = 7168;
// 128 rows (0.9 MB, within L2 here): the kernel's compute rate, no memory
// traffic, for comparison (the probe's ceiling does not apply to it).
constexpr size_t kInCacheRows = 128;

struct Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

Matrix RandomMatrix(size_t rows) {
  Matrix w{std::vector<uint8_t>(rows * kCols), std::vector<float>(mk::Fp8BlockScaleCount(rows, kCols))};
  std::mt19937 rng(7);
  for (uint8_t& c : w.codes) {
    c = static_cast<uint8_t>(rng() & 0xFF);
    if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
  }
  for (float& s : w.scales) s = 1e-3f * (1.0f + static_cast<float>(rng() % 1000) / 997.0f);
  return w;
}

const Matrix& Weights(size_t rows) {
  static const Matrix large = RandomMatrix(kRows);
  static const Matrix small = RandomMatrix(kInCacheRows);
  return rows == kRows ? large : small;
}

mk::ReadBandwidthProbe& Probe() {
  static mk::ReadBandwidthProbe probe(mk::ProbeArrayMiB());
  return probe;
}

void BM_Fp8BlockMatMul(benchmark::State& st, mk::Isa isa, size_t rows, size_t n) {
  const Matrix& m = Weights(rows);
  const mk::Fp8BlockView w = mk::MakeFp8BlockView(m.codes, m.scales, rows, kCols);
  std::vector<float> x(n * kCols), y(n * rows);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  const mk::KernelSet& k = mk::Kernels(isa);
  std::vector<double> ceilings;
  double product_s = 0;
  const bool probe = rows == kRows;  // a pass evicts the in-cache matrix
  for (auto _ : st) {
    if (probe) ceilings.push_back(Probe().Pass());
    const auto t0 = std::chrono::steady_clock::now();
    k.matmul_fp8_block(w, x.data(), n, y.data());
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(y.data());
    const double s = std::chrono::duration<double>(t1 - t0).count();
    product_s += s;
    st.SetIterationTime(s);
  }
  if (probe) ceilings.push_back(Probe().Pass());
  const double bytes = static_cast<double>(m.codes.size()) + 4.0 * static_cast<double>(m.scales.size());
  // Rate over the product's own time (the manual iteration times).
  const double rate = bytes * static_cast<double>(st.iterations()) / product_s;
  st.counters["weight_GB/s"] = rate * 1e-9;
  if (!probe) {
    st.SetLabel(k.matmul_fp8_block.name);
    return;
  }
  double best = 0;
  for (double c : ceilings) best = best > c ? best : c;
  const double median = mk::MedianOf(ceilings);
  st.counters["ceiling_best_GB/s"] = best * 1e-9;
  st.counters["ceiling_median_GB/s"] = median * 1e-9;
  st.counters["of_best"] = rate / best;
  st.counters["of_median"] = rate / median;
  st.SetLabel(std::string(k.matmul_fp8_block.name) + ", probe " + std::to_string(mk::ProbeArrayMiB()) + " MiB");
}

void Register() {
  for (mk::Isa isa : mk::SupportedIsas()) {
    if (!mk::IsaServes(isa)) continue;  // the rows for tests
    for (size_t rows : {kRows, kInCacheRows})
      for (size_t n : {size_t{1}, size_t{8}}) {
        const std::string name = std::string("fp8_block/") + mk::IsaName(isa) + "/" + std::to_string(rows) + "x" +
                                 std::to_string(kCols) + (rows == kInCacheRows ? "_in_cache" : "") + "/n" +
                                 std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(), BM_Fp8BlockMatMul, isa, rows, n)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(rows == kRows ? 1.0 : 0.3);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

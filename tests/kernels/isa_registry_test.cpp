// The ISA registry (kernels/cpu/dispatch.cpp) walked row by row: what a new
// row must satisfy to be served. For every row: its name and fallback are
// consistent, the CPU detection agrees with what the kernel reports in
// /proc/cpuinfo, each family's entry is either the row's own variant or
// exactly its fallback's, and, where this CPU runs the row, its products and
// elementwise kernels match the reference set on random inputs. (The other
// families are held to their references by their own tests, which reach every
// row through ForEachVariant.)
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/mxfp4_activation_bits.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"

#include "each_variant.hpp"
#include "random_inputs.hpp"

namespace moeserve::kernels {
namespace {

int Row(Isa isa) { return static_cast<int>(isa); }

TEST(IsaRegistry, RowsAreNamedRankedAndFallBackToEarlierRows) {
  const std::span<const Isa> all = AllIsas();
  ASSERT_EQ(all.size(), static_cast<size_t>(kIsaCount));
  EXPECT_EQ(all.front(), Isa::kReference);
  EXPECT_EQ(IsaFallback(Isa::kReference), Isa::kReference);
  std::set<std::string> names, suffixes;
  for (size_t i = 0; i < all.size(); ++i) {
    const Isa isa = all[i];
    SCOPED_TRACE(IsaName(isa));
    EXPECT_EQ(Row(isa), static_cast<int>(i));
    EXPECT_TRUE(names.insert(IsaName(isa)).second) << "two rows share a name";
    EXPECT_TRUE(suffixes.insert(IsaVariantSuffix(isa)).second) << "two rows share a variant suffix";
    ASSERT_TRUE(IsaByName(IsaName(isa)).has_value());
    EXPECT_EQ(*IsaByName(IsaName(isa)), isa);
    if (i > 0) {
      EXPECT_LT(Row(IsaFallback(isa)), Row(isa));
    }
    // A row runs on top of its fallback's kernels: never supported alone.
    if (IsaSupported(isa)) {
      EXPECT_TRUE(IsaSupported(IsaFallback(isa)));
    }
  }
  EXPECT_FALSE(IsaByName("").has_value());
  EXPECT_FALSE(IsaByName("avx").has_value());
  EXPECT_FALSE(IsaByName("AVX2").has_value());
  EXPECT_EQ(std::string(IsaName(static_cast<Isa>(kIsaCount))), "?");
  const std::string report = IsaReport();
  std::printf("[ registry ] %s\n", report.c_str());
  EXPECT_NE(report.find(std::string("best: ") + IsaName(BestIsa())), std::string::npos) << report;
}

// Without MOESERVE_CPU_ISA the choice is the registry's most preferred row
// this CPU runs; with it, a lower row by name (and never the reference).
// The last serving row this CPU runs.
Isa LastServing() {
  Isa best = Isa::kReference;
  for (Isa isa : SupportedIsas())
    if (IsaServes(isa)) best = isa;
  return best;
}

TEST(IsaRegistry, BestIsTheLastServingRowThisCpuRuns) {
  if (std::getenv("MOESERVE_CPU_ISA") != nullptr) GTEST_SKIP() << "MOESERVE_CPU_ISA is set in this environment";
  EXPECT_EQ(BestIsa(), LastServing());
  EXPECT_NE(BestIsa(), Isa::kReference);
  // The rows for tests never serve.
  EXPECT_FALSE(IsaServes(Isa::kReference));
  EXPECT_FALSE(IsaServes(Isa::kAmxModel));
  EXPECT_TRUE(IsaServes(Isa::kScalar));
}

TEST(IsaRegistryDeathTest, TheOverrideNamesARowAndCapsTheChoice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: BestIsa reads the variable once
  auto best_with = [](const char* value) {
    setenv("MOESERVE_CPU_ISA", value, 1);
    std::fprintf(stderr, "best=%s\n", IsaName(BestIsa()));
    std::exit(0);
  };
  EXPECT_EXIT(best_with("scalar"), ::testing::ExitedWithCode(0), "best=scalar");
  // The reference set is for tests, and an unknown name is reported, not guessed.
  const std::string unchanged = std::string("best=") + IsaName(LastServing());
  EXPECT_EXIT(best_with("reference"), ::testing::ExitedWithCode(0),
              "MOESERVE_CPU_ISA=reference is not one of scalar.avx2.avx512.amx; ignored.*" + unchanged);
  EXPECT_EXIT(best_with("amx_model"), ::testing::ExitedWithCode(0),
              "MOESERVE_CPU_ISA=amx_model is not one of scalar.avx2.avx512.amx; ignored.*" + unchanged);
  EXPECT_EXIT(best_with("avx9"), ::testing::ExitedWithCode(0), "MOESERVE_CPU_ISA=avx9 is not one of .*" + unchanged);
}

// The flags of the first processor in /proc/cpuinfo (empty where there is
// none: then only the rows that need nothing can be checked).
std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(IsaRegistry, DetectionAgreesWithTheKernelsCpuFlags) {
  const std::set<std::string> flags = CpuinfoFlags();
  EXPECT_TRUE(IsaSupported(Isa::kReference));
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags on this system";
  auto has = [&](std::initializer_list<const char*> want) {
    for (const char* f : want)
      if (!flags.count(f)) return false;
    return true;
  };
#if defined(__x86_64__)
  EXPECT_EQ(IsaSupported(Isa::kAvx2), has({"avx2", "fma"}));
  EXPECT_EQ(IsaSupported(Isa::kAvx512),
            has({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi"}));
  EXPECT_EQ(CpuHasAvx512Bf16(), IsaSupported(Isa::kAvx512) && has({"avx512_bf16"}));
  // The kernel lists amx_tile only where it manages the tile state; the row
  // also needs the tile data it grants on request (which detection made),
  // read back here on its own (ARCH_GET_XCOMP_PERM: the permitted features).
  const bool amx = IsaSupported(Isa::kAmx);
  uint64_t permitted = 0;
  constexpr long kArchGetXcompPerm = 0x1022;
  const bool tile_data = syscall(SYS_arch_prctl, kArchGetXcompPerm, &permitted) == 0 && (permitted >> 18 & 1) != 0;
  EXPECT_EQ(amx, IsaSupported(Isa::kAvx512) && has({"avx512_bf16", "amx_tile", "amx_bf16"}) && tile_data);
  EXPECT_EQ(CpuHasAmxBf16(), IsaSupported(Isa::kAmx));
  EXPECT_EQ(IsaSupported(Isa::kAmxModel), IsaSupported(Isa::kAvx512) && has({"avx512_bf16"}));
#else
  EXPECT_FALSE(IsaSupported(Isa::kAvx2));
  EXPECT_FALSE(IsaSupported(Isa::kAvx512));
#endif
}

// Every family of a row's set is the row's own variant (named for the row)
// or, where the row has no code for it, the very entry of its fallback's set.
// (Rows this CPU cannot run cannot be asked for; their sets are resolved by
// the same compile-time code, which dispatch.cpp's static_asserts check.)
TEST(IsaRegistry, EachFamilyIsTheRowsOwnOrItsFallbacks) {
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    const KernelSet& k = Kernels(isa);
    EXPECT_EQ(k.isa, isa);
    const KernelSet* fallback = isa == Isa::kReference ? nullptr : &Kernels(IsaFallback(isa));
    int families = 0;
    ForEachFamily([&](const char* family, auto member) {
      ++families;
      const auto& entry = k.*member;
      ASSERT_NE(entry.fn, nullptr) << family;
      const std::string own = std::string(family) + "_" + IsaVariantSuffix(isa);
      if (entry.name == own) return;
      if (fallback == nullptr) {
        // The root row has nothing to fall back to: what it borrows (the
        // scalar building blocks) must be another row's own entry, exactly.
        bool found = false;
        for (Isa lender : AllIsas())
          if (entry.name == std::string(family) + "_" + IsaVariantSuffix(lender)) {
            found = true;
            EXPECT_EQ(entry.fn, (Kernels(lender).*member).fn) << family;
          }
        EXPECT_TRUE(found) << family << " of the root row is named " << entry.name;
        return;
      }
      EXPECT_EQ(entry.fn, (fallback->*member).fn) << family;
      EXPECT_STREQ(entry.name, (fallback->*member).name) << family;
    });
    EXPECT_EQ(families, 26);
  }
}

// The sets derived from a row come from the registry too: every row but the
// reference (whose products stay exact) has the fewer-activation-bit MXFP4
// products, named for the row, with and without BF16-activation prefill.
TEST(IsaRegistry, EveryRowButTheReferenceHasTheFewerBitProducts) {
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    for (bool bf16 : {false, true}) {
      const KernelSet& plain = bf16 ? KernelsWithBf16Activations(isa) : Kernels(isa);
      for (int bits : {8, 16}) {
        const KernelSet& d = KernelsWithDecodeActivationBits(isa, bits, bf16);
        if (isa == Isa::kReference) {
          EXPECT_EQ(d.matmul_mxfp4.fn, plain.matmul_mxfp4.fn) << bits;
          EXPECT_EQ(d.matvec_mxfp4_many.fn, plain.matvec_mxfp4_many.fn) << bits;
          continue;
        }
        const std::string tag = std::string(IsaName(isa)) + (bf16 ? "+bf16act" : "") + "+act" + std::to_string(bits);
        EXPECT_EQ(std::string(d.matmul_mxfp4.name), "matmul_mxfp4_" + tag);
        EXPECT_EQ(std::string(d.matvec_mxfp4_many.name), "matvec_mxfp4_many_" + tag);
        EXPECT_NE(d.matmul_mxfp4.fn, plain.matmul_mxfp4.fn) << tag;
        EXPECT_NE(d.matvec_mxfp4_many.fn, plain.matvec_mxfp4_many.fn) << tag;
      }
    }
  }
}

uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
float Bf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// got within rel * |reference| + abs of the reference, element by element.
void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& mag,
                float rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * mag[i] + 1e-6f)) {
      ADD_FAILURE() << what << " at " << i << ": got " << got[i] << " want " << want[i];
      ++bad;
    }
}

// sum_k |W[o, k] X[t, k]| for every output: the scale of a dot product's
// rounding.
std::vector<float> Magnitudes(const std::vector<float>& W, size_t out, size_t in, const std::vector<float>& X,
                              size_t n) {
  std::vector<float> m(n * out);
  for (size_t t = 0; t < n; ++t)
    for (size_t o = 0; o < out; ++o) {
      double s = 0;
      for (size_t k = 0; k < in; ++k) s += std::fabs(W[o * in + k] * X[t * in + k]);
      m[t * out + o] = static_cast<float>(s);
    }
  return m;
}

// One row at a time against the reference set: the products at a
// matrix-vector and a GEMM row count, RMSNorm and the gates. A row whose
// kernel computed something else fails here.
TEST(IsaRegistry, EveryRowThisCpuRunsMatchesTheReference) {
  const KernelSet& ref = Kernels(Isa::kReference);
  std::mt19937 rng(38);
  const size_t out = 48, in = 256;
  const std::vector<float> wf = Random(out * in, rng);
  std::vector<uint16_t> wb(out * in);
  std::vector<float> wb_value(out * in);
  for (size_t i = 0; i < wb.size(); ++i) wb_value[i] = Bf16Value(wb[i] = Bf16Bits(wf[i]));
  // MXFP4: random codes, scales 2^-3 .. 2^3.
  std::vector<uint8_t> blocks(out * in / 2), scales(out * in / 32);
  for (uint8_t& b : blocks) b = static_cast<uint8_t>(rng() & 0xff);
  for (uint8_t& s : scales) s = static_cast<uint8_t>(124 + rng() % 7);
  const Mxfp4PackedStack packed(blocks.data(), scales.data(), 1, out, in);
  const Mxfp4PackedView w = packed.matrix(0);
  std::vector<float> wq(out * in);
  for (size_t o = 0; o < out; ++o) DecodePackedRow(w, o, 0, in / 32, wq.data() + o * in, 1);

  int rows_checked = 0;
  ForEachVariant("registry rows", [&](const KernelSet& k) {
    ++rows_checked;
    for (size_t n : {size_t{1}, size_t{3}, size_t{40}}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::vector<float> X = Random(n * in, rng);
      std::vector<float> got(n * out), want(n * out);

      ref.matmul_f32(wf.data(), out, in, X.data(), n, want.data());
      k.matmul_f32(wf.data(), out, in, X.data(), n, got.data());
      ExpectNear(got, want, Magnitudes(wf, out, in, X, n), 1e-5f, k.matmul_f32.name);

      ref.matmul_bf16(wb.data(), out, in, X.data(), n, want.data());
      k.matmul_bf16(wb.data(), out, in, X.data(), n, got.data());
      ExpectNear(got, want, Magnitudes(wb_value, out, in, X, n), 1e-5f, k.matmul_bf16.name);

      // The MXFP4 matrix-vector kernels quantise activations to 21 bits.
      ref.matmul_mxfp4(w, X.data(), n, want.data());
      k.matmul_mxfp4(w, X.data(), n, got.data());
      ExpectNear(got, want, Magnitudes(wq, out, in, X, n), 1e-5f, k.matmul_mxfp4.name);
    }
    const size_t d = 77;  // off every vector width
    const std::vector<float> a = Random(d, rng), b = Random(d, rng);
    std::vector<float> got(d), want(d), mag(d);
    for (size_t i = 0; i < d; ++i) mag[i] = 1.0f + std::fabs(a[i] * b[i]);
    ref.rms_norm(a.data(), b.data(), 1e-6f, d, want.data());
    k.rms_norm(a.data(), b.data(), 1e-6f, d, got.data());
    ExpectNear(got, want, mag, 1e-5f, k.rms_norm.name);
    ref.silu_mul(a.data(), b.data(), want.data(), d);
    k.silu_mul(a.data(), b.data(), got.data(), d);
    ExpectNear(got, want, mag, 1e-5f, k.silu_mul.name);
    ref.sigmoid_mul(a.data(), b.data(), want.data(), d);
    k.sigmoid_mul(a.data(), b.data(), got.data(), d);
    ExpectNear(got, want, mag, 1e-5f, k.sigmoid_mul.name);
  });
  EXPECT_EQ(rows_checked, static_cast<int>(SupportedIsas().size()));
}

}  // namespace
}  // namespace moeserve::kernels

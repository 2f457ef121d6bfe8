// The dispatch mechanism itself (cpu_kernels.hpp): which sets this CPU runs,
// that every set holds a function for every family, and that asking for an
// Isa selects that Isa's variants (by the name each entry carries), never
// another's.
#include "moeserve/kernels/cpu_kernels.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::kernels {
namespace {

// The names below pin the sets of the first four rows of the registry, as
// they were before it existed (the rule every row follows, these and any
// added later, is in isa_registry_test.cpp).
constexpr Isa kPinned[] = {Isa::kReference, Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
bool Pinned(Isa isa) { return std::find(std::begin(kPinned), std::end(kPinned), isa) != std::end(kPinned); }

std::string_view Suffix(Isa isa) {
  switch (isa) {
    case Isa::kReference: return "ref";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
    case Isa::kAmxModel: return "amx_model";
  }
  return "?";
}

// Families whose every set has code of its own: the set for an Isa must name
// that Isa's variant. (The others fall back as listed in FallbackSuffix.)
const std::set<std::string_view> kOwnVariantEverywhere = {
    "matmul_f32", "matmul_bf16", "matmul_mxfp4", "matvec_bf16_many", "matvec_mxfp4_many", "headwise_matvec",
    "mla_decode", "mla_rows", "indexer_scores", "matmul_mxfp4_bf16act", "matmul_bf16_bf16act", "indexer_scores_batch",
    "delta_rule_chunked", "causal_conv_silu", "matmul_fp8_block", "indexer_scores_int8", "indexer_scores_int8_blocked"};

// What a set without a variant of its own for a family holds instead.
std::string_view FallbackSuffix(std::string_view family, Isa isa) {
  const bool block = family == "mxfp4_quantize" || family == "mxfp4_matvec" || family == "mxfp4_gemm" ||
                     family == "f32_matmul_cols" || family == "mxfp4_matvec_rows";
  if (isa == Isa::kReference) return block ? "scalar" : "ref";
  if (isa == Isa::kScalar)  // the gates, RMSNorm and the delta rule: the reference is the scalar form
    return block ? "scalar" : "ref";
  if (isa == Isa::kAvx2 && family == "mxfp4_quantize") return "scalar";
  return Suffix(isa);
}

TEST(KernelSets, ReportsWhichIsasThisCpuRuns) {
  std::printf("[ variants ] %s; threads: %d\n", IsaReport().c_str(), DefaultThreadPool().size());
  ASSERT_FALSE(SupportedIsas().empty());
  EXPECT_EQ(SupportedIsas().front(), Isa::kReference);
  EXPECT_TRUE(IsaSupported(Isa::kReference));
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  EXPECT_NE(BestIsa(), Isa::kReference);
  EXPECT_TRUE(IsaSupported(BestIsa()));
  const std::vector<Isa> supported = SupportedIsas();
  for (Isa isa : AllIsas())
    EXPECT_EQ(IsaSupported(isa), std::find(supported.begin(), supported.end(), isa) != supported.end()) << IsaName(isa);
}

TEST(KernelSets, AskingForAnIsaSelectsItsVariants) {
  for (Isa isa : SupportedIsas()) {
    if (!Pinned(isa)) continue;
    SCOPED_TRACE(IsaName(isa));
    const KernelSet& k = Kernels(isa);
    EXPECT_EQ(k.isa, isa);
    int families = 0;
    ForEachKernel(k, [&](std::string_view family, std::string_view name, bool present) {
      ++families;
      EXPECT_TRUE(present) << family;
      const std::string_view want = kOwnVariantEverywhere.count(family) ? Suffix(isa) : FallbackSuffix(family, isa);
      EXPECT_EQ(name, std::string(family) + "_" + std::string(want));
    });
    EXPECT_EQ(families, 26);
  }
}

TEST(KernelSets, EachIsaHasItsOwnFunctions) {
  // Two pinned sets never share the function of a family that has a variant
  // per Isa: a set that silently held another's would pass the name check
  // only if its name lied. (A later row borrows most families from its
  // fallback: isa_registry_test.cpp holds it to that.)
  std::vector<Isa> supported;
  for (Isa isa : SupportedIsas())
    if (Pinned(isa)) supported.push_back(isa);
  for (size_t a = 0; a < supported.size(); ++a)
    for (size_t b = a + 1; b < supported.size(); ++b) {
      const KernelSet& x = Kernels(supported[a]);
      const KernelSet& y = Kernels(supported[b]);
      EXPECT_NE(x.matmul_f32.fn, y.matmul_f32.fn);
      EXPECT_NE(x.matmul_bf16.fn, y.matmul_bf16.fn);
      EXPECT_NE(x.matmul_mxfp4.fn, y.matmul_mxfp4.fn);
      EXPECT_NE(x.matvec_bf16_many.fn, y.matvec_bf16_many.fn);
      EXPECT_NE(x.matvec_mxfp4_many.fn, y.matvec_mxfp4_many.fn);
      EXPECT_NE(x.headwise_matvec.fn, y.headwise_matvec.fn);
      EXPECT_NE(x.mla_decode.fn, y.mla_decode.fn);
      EXPECT_NE(x.indexer_scores.fn, y.indexer_scores.fn);
      EXPECT_NE(x.matmul_mxfp4_bf16act.fn, y.matmul_mxfp4_bf16act.fn);
      EXPECT_NE(x.matmul_bf16_bf16act.fn, y.matmul_bf16_bf16act.fn);
      EXPECT_NE(x.indexer_scores_batch.fn, y.indexer_scores_batch.fn);
      EXPECT_NE(x.indexer_scores_int8.fn, y.indexer_scores_int8.fn);
    }
}

TEST(KernelSetsDeathTest, AnIsaThisCpuCannotRunIsRefused) {
  EXPECT_DEATH(Kernels(static_cast<Isa>(kIsaCount)), "cannot run");
  for (Isa isa : AllIsas()) {
    if (!IsaSupported(isa)) {
      EXPECT_DEATH(Kernels(isa), std::string("the ") + IsaName(isa) + " variants");
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels

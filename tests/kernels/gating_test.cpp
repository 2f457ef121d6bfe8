// The silu_mul / sigmoid_mul families, every variant this CPU supports,
// against the scalar forms: the whole float range, tails shorter than a
// vector, aliasing, NaN.
#include "moeserve/kernels/gating.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "each_variant.hpp"

namespace moeserve::kernels {
namespace {

struct Case {
  const char* name;
  Kernel<GateFn> KernelSet::*fast;
  GateFn ref;
};

const Case kCases[] = {{"silu", &KernelSet::silu_mul, SiluMulRef}, {"sigmoid", &KernelSet::sigmoid_mul, SigmoidMulRef}};

std::vector<float> Inputs(size_t n, std::mt19937& rng) {
  std::vector<float> v(n);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f), narrow(-6.0f, 6.0f);
  for (size_t i = 0; i < n; ++i) v[i] = i % 3 == 0 ? wide(rng) : narrow(rng);
  // The edges: zero, tiny, the ends of the exponential's range and beyond.
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 88.5f, -88.5f, 103.0f, -103.0f, 500.0f, -500.0f};
  for (size_t i = 0; i < std::size(edges) && i < n; ++i) v[i] = edges[i];
  return v;
}

TEST(Gating, MatchesScalarFormsOnEveryIsa) {
  ForEachVariant("silu_mul, sigmoid_mul", [](const KernelSet& k) {
    std::mt19937 rng(7);
    for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{31}, size_t{1000}, size_t{4099}}) {
      const std::vector<float> a = Inputs(n, rng);
      std::vector<float> b(n);
      std::normal_distribution<float> d(0.0f, 2.0f);
      for (auto& x : b) x = d(rng);
      for (const Case& c : kCases) {
        SCOPED_TRACE(std::string((k.*c.fast).name) + " n=" + std::to_string(n));
        std::vector<float> want(n), got(n, -1.0f);
        c.ref(a.data(), b.data(), want.data(), n);
        (k.*c.fast)(a.data(), b.data(), got.data(), n);
        for (size_t i = 0; i < n; ++i) {
          // A few ulp of the result; below 1e-35 (where e^-x has left the
          // normal floats, past |x| ~ 87) every form is zero for our purposes.
          const float tol = 4e-7f * std::fabs(want[i]) + 1e-35f;
          ASSERT_NEAR(got[i], want[i], tol) << "a=" << a[i] << " b=" << b[i] << " at " << i;
        }
      }
    }
  });
}

TEST(Gating, OutputMayAliasAnInput) {
  std::mt19937 rng(8);
  const std::vector<float> a = Inputs(77, rng);
  const std::vector<float> b(77, 1.5f);
  ForEachVariant("silu_mul", [&](const KernelSet& k) {
    std::vector<float> want(77), in_a = a, in_b = b;
    k.silu_mul(a.data(), b.data(), want.data(), a.size());
    k.silu_mul(in_a.data(), b.data(), in_a.data(), a.size());
    k.silu_mul(a.data(), in_b.data(), in_b.data(), a.size());
    EXPECT_EQ(in_a, want);
    EXPECT_EQ(in_b, want);
  });
}

TEST(Gating, NanInputGivesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(19, 0.5f), b(19, 1.0f), out(19);
  a[3] = nan;
  a[17] = nan;  // in the tail of a 16-wide vector
  ForEachVariant("silu_mul, sigmoid_mul", [&](const KernelSet& k) {
    for (const Case& c : kCases) {
      (k.*c.fast)(a.data(), b.data(), out.data(), a.size());
      EXPECT_TRUE(std::isnan(out[3]));
      EXPECT_TRUE(std::isnan(out[17]));
      EXPECT_FALSE(std::isnan(out[4]));
    }
  });
}

TEST(Gating, SaturatesLikeTheScalarForms) {
  ForEachVariant("silu_mul, sigmoid_mul", [](const KernelSet& k) {
    const std::vector<float> a = {-1000.0f, 1000.0f, -90.0f, 90.0f}, b(4, 2.0f);
    std::vector<float> sig(4), silu(4);
    k.sigmoid_mul(a.data(), b.data(), sig.data(), 4);
    k.silu_mul(a.data(), b.data(), silu.data(), 4);
    EXPECT_NEAR(sig[0], 0.0f, 1e-30f);
    EXPECT_EQ(sig[1], 2.0f);
    EXPECT_NEAR(silu[0], 0.0f, 1e-30f);
    EXPECT_EQ(silu[1], 2000.0f);
    EXPECT_EQ(silu[3], 180.0f);
  });
}

}  // namespace
}  // namespace moeserve::kernels

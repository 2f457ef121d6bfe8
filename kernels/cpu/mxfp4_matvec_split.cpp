// The split-activation MXFP4 matrix-vector product (mxfp4_matvec_split.hpp):
// quantiser, scalar reference, variant choice and threading. The AVX-512
// VNNI building block is in mxfp4_matvec_split_vnni.cpp.
#include "moeserve/kernels/mxfp4_matvec_split.hpp"

#include <algorithm>
#include <cmath>

#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace {

// Twice the E2M1 value of each code (integers; the scale carries the 1/2).
constexpr int kTwiceE2M1[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Row 16g + r's exact integer sum over block b.
int32_t BlockSum(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, size_t g, size_t b, size_t r) {
  const size_t nb = w.in / 32;
  const uint8_t* codes = w.codes + (g * nb + b) * 256;
  int32_t hi = 0, lo = 0;
  for (size_t c = 0; c < 4; ++c)
    for (size_t j = 0; j < 4; ++j) {
      const uint8_t byte = codes[c * 64 + r * 4 + j];
      const size_t k_lo = b * 32 + 8 * c + j, k_hi = k_lo + 4;
      const int w_lo = kTwiceE2M1[byte & 15], w_hi = kTwiceE2M1[byte >> 4];
      hi += w_lo * x.part(0)[k_lo] + w_hi * x.part(0)[k_hi];
      if (x.parts == 2) lo += w_lo * x.part(1)[k_lo] + w_hi * x.part(1)[k_hi];
    }
  return x.parts == 2 ? hi * 256 + lo : hi;
}

}  // namespace

namespace cpu {
// The flags mxfp4_matvec_split_vnni.cpp is built with.
bool CpuHasAvx512Vnni() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                          __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

void mxfp4_split_matvec_scalar(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y, size_t g_begin,
                               size_t g_end) {
  const size_t nb = w.in / 32;
  for (size_t g = g_begin; g < g_end; ++g)
    for (size_t r = 0; r < kMxfp4PackRows && g * kMxfp4PackRows + r < w.out; ++r) {
      float acc = 0.0f;
      for (size_t b = 0; b < nb; ++b) {
        // The same operations, in the same order, as the vector variants:
        // E8M0 scale times activation scale, then one fused multiply-add.
        const float sc = kE8M0.v[w.scales[(g * nb + b) * 16 + r]] * x.scale[b];
        acc = std::fma(static_cast<float>(BlockSum(w, x, g, b, r)), sc, acc);
      }
      y[g * kMxfp4PackRows + r] = acc;
    }
}
}  // namespace cpu

void QuantizeMxfp4Split(const float* x, size_t in, int parts, Mxfp4SplitActivations& out) {
  const int32_t qmax = Mxfp4SplitQmax(parts);
  const size_t nb = in / 32;
  out.parts = parts;
  out.in = in;
  out.q.assign(static_cast<size_t>(parts) * in, 0);
  out.scale.assign(nb, 0.0f);
  out.offset.assign(nb, 0);
  for (size_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    bool finite = true;
    for (size_t k = 0; k < 32; ++k) {
      finite = finite && std::isfinite(xb[k]);
      amax = std::max(amax, std::fabs(xb[k]));
    }
    if (!finite) {
      out.scale[b] = std::nanf("");
      continue;
    }
    const float inv = amax > 0.0f ? static_cast<float>(qmax) / amax : 0.0f;
    int32_t sum = 0;
    for (size_t k = 0; k < 32; ++k) {
      const int32_t q = std::clamp(static_cast<int32_t>(std::nearbyint(xb[k] * inv)), -qmax, qmax);
      sum += q;
      if (parts == 1) {
        out.q[b * 32 + k] = static_cast<int8_t>(q);
      } else {
        const int32_t hi = (q + 128) >> 8;  // arithmetic: hi in [-127, 127], lo in [-128, 127]
        out.q[b * 32 + k] = static_cast<int8_t>(hi);
        out.q[in + b * 32 + k] = static_cast<int8_t>(q - 256 * hi);
      }
    }
    out.scale[b] = amax / static_cast<float>(qmax) * 0.5f;
    out.offset[b] = 12 * sum;
  }
}

std::vector<Mxfp4SplitVariant> Mxfp4SplitVariants() {
  std::vector<Mxfp4SplitVariant> v{{"scalar", cpu::mxfp4_split_matvec_scalar}};
  if (cpu::CpuHasAvx512Vnni()) v.push_back({"avx512vnni", cpu::mxfp4_split_matvec_avx512vnni});
  return v;
}

Mxfp4SplitMatVecFn BestMxfp4SplitMatVec() {
  static const Mxfp4SplitMatVecFn best = Mxfp4SplitVariants().back().fn;
  return best;
}

void MatVecMxfp4SplitRef(const Mxfp4PackedView& w, const Mxfp4SplitActivations& x, float* y) {
  cpu::mxfp4_split_matvec_scalar(w, x, y, 0, Mxfp4PackedGroups(w.out));
}

void MatVecMxfp4Split(const Mxfp4PackedView& w, const float* x, int parts, float* y) {
  if (w.out == 0) return;
  if (w.in == 0) return std::fill(y, y + w.out, 0.0f);
  thread_local Mxfp4SplitActivations acts;
  QuantizeMxfp4Split(x, w.in, parts, acts);
  const Mxfp4SplitActivations& a = acts;  // workers must not name the thread_local
  const Mxfp4SplitMatVecFn fn = BestMxfp4SplitMatVec();
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  const size_t groups = Mxfp4PackedGroups(w.out);
  // Tasks of about 512 KiB of codes, at least 4 groups (streamed side by
  // side), as matvec_mxfp4's.
  const size_t chunk = std::max<size_t>(4, std::min(std::max<size_t>(1, groups / threads),
                                                    (size_t{512} << 10) / (w.in / 32 * 256)));
  const size_t tasks = (groups + chunk - 1) / chunk;
  auto run = [&](size_t i) { fn(w, a, y, i * chunk, std::min(groups, (i + 1) * chunk)); };
  if (threads == 1 || tasks == 1) {
    for (size_t i = 0; i < tasks; ++i) run(i);
  } else {
    pool.ParallelFor(tasks, run);
  }
}

}  // namespace moeserve::kernels

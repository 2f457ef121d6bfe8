// The packed MXFP4 layout (see mxfp4_packed.hpp): repacking, unpacking,
// activation quantisation, and the matmul_mxfp4 / matvec_mxfp4_many families
// (reference and threaded variants).
#include "moeserve/kernels/mxfp4_packed.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/mxfp4.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "task_split.hpp"
#include "variants.hpp"

namespace moeserve::kernels {
namespace {

constexpr uint8_t kPadScale = 127;  // 1.0: padding rows hold zeros at a harmless scale

// Byte offset of (row r, element k) within one group's block b, and whether
// the element is the high nibble.
struct CodeSlot {
  size_t byte;
  bool high;
};
inline CodeSlot Slot(size_t r, size_t k_in_block) {
  const size_t c = k_in_block / 8, j = k_in_block % 8;
  return {c * 64 + r * 4 + (j & 3), j >= 4};
}

}  // namespace

void PackMxfp4(const uint8_t* blocks, const uint8_t* scales, size_t out, size_t in, uint8_t* codes,
               uint8_t* packed_scales) {
  const size_t nb = in / 32, groups = Mxfp4PackedGroups(out);
  // Only the last group can have padding rows: zero codes there.
  if (out % kMxfp4PackRows != 0) std::memset(codes + (groups - 1) * nb * 256, 0, nb * 256);
  std::memset(packed_scales, kPadScale, Mxfp4PackedScaleBytes(out, in));
  for (size_t o = 0; o < out; ++o) {
    const size_t g = o / kMxfp4PackRows, r = o % kMxfp4PackRows;
    for (size_t b = 0; b < nb; ++b) {
      packed_scales[(g * nb + b) * 16 + r] = scales[o * nb + b];
      // File byte i holds elements 2i (low nibble) and 2i+1 (high); packed
      // byte (c, r, j) holds elements 8c+j (low) and 8c+4+j (high).
      const uint8_t* src = blocks + (o * nb + b) * kMxfp4BlockBytes;
      uint8_t* dst = codes + (g * nb + b) * 256 + r * 4;
      for (size_t c = 0; c < 4; ++c) {
        const uint8_t* q = src + 4 * c;  // elements 8c .. 8c+7
        const uint8_t e[8] = {static_cast<uint8_t>(q[0] & 15), static_cast<uint8_t>(q[0] >> 4),
                              static_cast<uint8_t>(q[1] & 15), static_cast<uint8_t>(q[1] >> 4),
                              static_cast<uint8_t>(q[2] & 15), static_cast<uint8_t>(q[2] >> 4),
                              static_cast<uint8_t>(q[3] & 15), static_cast<uint8_t>(q[3] >> 4)};
        for (size_t j = 0; j < 4; ++j) dst[c * 64 + j] = static_cast<uint8_t>(e[j] | (e[j + 4] << 4));
      }
    }
  }
}

void UnpackMxfp4(const Mxfp4PackedView& w, uint8_t* blocks, uint8_t* scales) {
  const size_t nb = w.in / 32;
  for (size_t o = 0; o < w.out; ++o) {
    const size_t g = o / kMxfp4PackRows, r = o % kMxfp4PackRows;
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* src = w.codes + (g * nb + b) * 256;
      scales[o * nb + b] = w.scales[(g * nb + b) * 16 + r];
      uint8_t* dst = blocks + (o * nb + b) * kMxfp4BlockBytes;
      for (size_t k = 0; k < 32; k += 2) {
        const CodeSlot e = Slot(r, k), od = Slot(r, k + 1);
        const uint8_t lo = e.high ? (src[e.byte] >> 4) : (src[e.byte] & 0x0F);
        const uint8_t hi = od.high ? (src[od.byte] >> 4) : (src[od.byte] & 0x0F);
        dst[k / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void DecodePackedRow(const Mxfp4PackedView& w, size_t o, size_t b0, size_t nblocks, float* dst, size_t stride) {
  const size_t nb = w.in / 32;
  const size_t g = o / kMxfp4PackRows, r = o % kMxfp4PackRows;
  for (size_t b = b0; b < b0 + nblocks; ++b) {
    const uint8_t* src = w.codes + (g * nb + b) * 256 + r * 4;
    const float sc = cpu::kE8M0.v[w.scales[(g * nb + b) * 16 + r]];
    float* d = dst + (b - b0) * 32 * stride;
    for (size_t c = 0; c < 4; ++c)
      for (size_t j = 0; j < 4; ++j) {
        const uint8_t byte = src[c * 64 + j];
        d[(8 * c + j) * stride] = kE2M1Values[byte & 0x0F] * sc;
        d[(8 * c + 4 + j) * stride] = kE2M1Values[byte >> 4] * sc;
      }
  }
}

void DecodePackedPanel(const Mxfp4PackedView& w, size_t o0, size_t nr, size_t k0, size_t kc, float* Wp, size_t width) {
  for (size_t c = 0; c < width; ++c) {
    if (c < nr) {
      DecodePackedRow(w, o0 + c, k0 / 32, kc / 32, Wp + c, width);
    } else {
      for (size_t k = 0; k < kc; ++k) Wp[k * width + c] = 0.0f;
    }
  }
}

Mxfp4PackedStack::Mxfp4PackedStack(const uint8_t* blocks, const uint8_t* scales, size_t count, size_t out, size_t in)
    : codes_(count * Mxfp4PackedCodeBytes(out, in)),
      scales_(count * Mxfp4PackedScaleBytes(out, in)),
      count_(count),
      out_(out),
      in_(in) {
  const size_t file_blocks = out * in / 2, file_scales = out * in / 32;
  // One matrix per task: loading a large model is mostly this repacking (and
  // the page faults of the fresh buffers), which every core can share.
  DefaultThreadPool().ParallelFor(count, [&](size_t i) {
    PackMxfp4(blocks + i * file_blocks, scales + i * file_scales, out, in,
              codes_.data() + i * Mxfp4PackedCodeBytes(out, in), scales_.data() + i * Mxfp4PackedScaleBytes(out, in));
  });
}

const Mxfp4Activations& Mxfp4ActivationBuffer::Quantize(const float* X, size_t n, size_t in, Mxfp4QuantizeFn quantize,
                                                        int nparts, ThreadPool* pool) {
  const size_t nb = in / 32, np = static_cast<size_t>(nparts);
  parts_.resize(n * np * in);
  scale_.resize(n * nb);
  offset_.resize(n * nb);
  const size_t threads = pool != nullptr ? static_cast<size_t>(pool->size()) : 1;
  if (threads > 1 && n >= 2 * threads) {
    // Rows are independent: each thread quantises a contiguous run of them.
    const size_t chunk = (n + threads - 1) / threads;
    int8_t* parts = parts_.data();
    float* scale = scale_.data();
    int32_t* offset = offset_.data();
    pool->ParallelFor((n + chunk - 1) / chunk, [&](size_t i) {
      const size_t t0 = i * chunk, rows = std::min(n, t0 + chunk) - t0;
      quantize(X + t0 * in, rows, in, nparts, parts + t0 * np * in, scale + t0 * nb, offset + t0 * nb);
    });
  } else {
    quantize(X, n, in, nparts, parts_.data(), scale_.data(), offset_.data());
  }
  view_ = {n, in, nparts, parts_.data(), scale_.data(), offset_.data()};
  return view_;
}

namespace cpu {

void mxfp4_quantize_scalar(const float* X, size_t n, size_t in, int nparts, int8_t* parts, float* scale,
                           int32_t* offset) {
  const size_t nb = in / 32;
  const size_t np = static_cast<size_t>(nparts);
  const float qmax = static_cast<float>(Mxfp4ActQmax(nparts));
  // Adding and taking back 1.5 * 2^23 rounds |v| < 2^22 to the nearest
  // integer (ties to even, as vcvtps2dq does) in plain float arithmetic.
  constexpr float kRound = 12582912.0f;
  for (size_t t = 0; t < n; ++t)
    for (size_t b = 0; b < nb; ++b) {
      const float* x = X + t * in + b * 32;
      float amax = 0.0f;
      for (size_t k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
      bool finite = amax <= std::numeric_limits<float>::max();
      for (size_t k = 0; k < 32; ++k) finite &= x[k] == x[k];  // NaN fails
      // A block of zeros gets zero codes at scale 0. A non-finite activation
      // makes the block's scale NaN (and its codes 0), so the products it
      // feeds come out NaN, as the fp32 reference's would.
      const float inv = finite && amax > 0.0f ? qmax / amax : 0.0f;
      int8_t* p0 = parts + t * np * in + b * 32;
      int32_t sum = 0;
      for (size_t k = 0; k < 32; ++k) {
        const float v = finite ? x[k] * inv : 0.0f;
        const int32_t q = static_cast<int32_t>((v + kRound) - kRound);  // |q| <= qmax
        sum += q;
        if (nparts == 3) {
          const int32_t h = (q + 8192) >> 14;  // in [-64, 64]
          const int32_t r = q - h * 16384;     // in [-8192, 8191]
          const int32_t m = (r + 64) >> 7;     // in [-64, 64]
          p0[k] = static_cast<int8_t>(h);
          p0[in + k] = static_cast<int8_t>(m);
          p0[2 * in + k] = static_cast<int8_t>(r - m * 128);  // in [-64, 63]
        } else if (nparts == 2) {
          const int32_t h = (q + 128) >> 8;  // in [-127, 127]
          p0[k] = static_cast<int8_t>(h);
          p0[in + k] = static_cast<int8_t>(q - h * 256);  // in [-128, 127]
        } else {
          p0[k] = static_cast<int8_t>(q);
        }
      }
      scale[t * nb + b] = finite ? amax * (0.5f / qmax) : std::numeric_limits<float>::quiet_NaN();
      offset[t * nb + b] = 12 * sum;
    }
}

}  // namespace cpu

void MatMulMxfp4PackedRef(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
  thread_local std::vector<uint8_t> blocks, scales;
  blocks.resize(w.out * w.in / 2);
  scales.resize(w.out * w.in / 32);
  UnpackMxfp4(w, blocks.data(), scales.data());
  MatMulMxfp4Ref(blocks.data(), scales.data(), w.out, w.in, X, n, Y);
}

void MatVecMxfp4ManyRef(std::span<const Mxfp4MatVecJob> jobs) {
  for (const Mxfp4MatVecJob& j : jobs) MatMulMxfp4PackedRef(j.w, j.X, j.n, j.Y);
}

namespace {

// The integer product of many rows: X quantised as the matrix-vector form
// quantises it (rows split over the pool), then `rows` (a building block
// computing mxfp4_matvec's results: the set's mxfp4_matvec_rows) on one range
// of groups per thread. Each row's result is the one it gets alone.
void MatMulMxfp4Int8(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const KernelSet& k, int nparts,
                     Mxfp4MatVecFn rows) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  thread_local Mxfp4ActivationBuffer buffer;
  const Mxfp4Activations& x = buffer.Quantize(X, n, w.in, k.mxfp4_quantize.fn, nparts, &pool);
  const size_t groups = Mxfp4PackedGroups(w.out), nb = w.in / 32;
  if (threads == 1 || static_cast<double>(w.out) * static_cast<double>(w.in) * n < 65536.0)
    return rows(w, x, Y, 0, groups, 0, nb);
  const size_t chunk = (groups + threads - 1) / threads;
  pool.ParallelFor((groups + chunk - 1) / chunk,
                   [&](size_t i) { rows(w, x, Y, i * chunk, std::min(groups, (i + 1) * chunk), 0, nb); });
}

}  // namespace

namespace cpu {

// matmul_mxfp4 with the building blocks of k's Isa, activations of the
// matrix-vector form split into nparts int8 parts; from kMxfp4GemmMinRows
// rows on, the fp32 GEMM, or with `int8_rows` the integer product of many
// rows (MatMulMxfp4Int8).
void MatMulMxfp4Over(const Mxfp4PackedView& w, const float* X, size_t n, float* Y, const KernelSet& k, int nparts,
                     Mxfp4RowsBlock int8_rows) {
  if (w.out == 0 || n == 0) return;
  if (w.in == 0) return std::fill(Y, Y + w.out * n, 0.0f);
  if (n < kMxfp4GemmMinRows) {
    const Mxfp4MatVecJob job{w, X, n, Y};
    return MatVecMxfp4ManyOver(std::span(&job, 1), k, nparts);
  }
  if (int8_rows != nullptr) return MatMulMxfp4Int8(w, X, n, Y, k, nparts, int8_rows);
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  if (threads == 1 || static_cast<double>(w.out) * static_cast<double>(w.in) * n < 65536.0)
    return k.mxfp4_gemm(w, X, n, Y, 0, w.out);
  // One contiguous range per thread, aligned to the 32-column panel.
  size_t chunk = (w.out + threads - 1) / threads;
  chunk = (chunk + 31) / 32 * 32;
  pool.ParallelFor((w.out + chunk - 1) / chunk,
                   [&](size_t i) { k.mxfp4_gemm(w, X, n, Y, i * chunk, std::min(w.out, (i + 1) * chunk)); });
}

void MatVecMxfp4ManyOver(std::span<const Mxfp4MatVecJob> jobs, const KernelSet& k, int nparts) {
  ThreadPool& pool = DefaultThreadPool();
  const size_t threads = static_cast<size_t>(pool.size());
  thread_local std::vector<Mxfp4ActivationBuffer> buffers;
  if (buffers.size() < jobs.size()) buffers.resize(jobs.size());
  thread_local std::vector<const Mxfp4Activations*> acts;
  acts.assign(jobs.size(), nullptr);
  thread_local std::vector<RangeTask> tasks;  // runs of groups
  tasks.clear();
  double work = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Mxfp4MatVecJob& jb = jobs[j];
    if (jb.w.out == 0 || jb.n == 0) continue;
    if (jb.w.in == 0) {
      std::fill(jb.Y, jb.Y + jb.w.out * jb.n, 0.0f);
      continue;
    }
    // Jobs with the same input (a decode step's experts) share one quantised copy.
    for (size_t i = 0; i < j && !acts[j]; ++i)
      if (acts[i] && jobs[i].X == jb.X && jobs[i].n == jb.n && jobs[i].w.in == jb.w.in) acts[j] = acts[i];
    if (!acts[j]) acts[j] = &buffers[j].Quantize(jb.X, jb.n, jb.w.in, k.mxfp4_quantize.fn, nparts);
    // Tasks of about kTaskBytes of codes: long enough for the prefetchers
    // to stream (shorter ones measured slower), short enough that the two
    // threads finish together; whole rows keep each task one sequential run.
    const size_t groups = Mxfp4PackedGroups(jb.w.out);
    // (A small-preset decode step's 4-expert pass: 69 us with 8 KiB tasks,
    // 53 with 128 KiB; 7168 x 2048 alone: ~53 GB/s best with 128 KiB, ~60
    // with 512 KiB.)
    constexpr size_t kTaskBytes = 512 << 10;
    // At least 4 groups, which the kernels stream side by side.
    const size_t chunk =
        std::max<size_t>(1, std::min(groups / threads, std::max<size_t>(4, kTaskBytes / (jb.w.in / 32 * 256))));
    for (size_t g = 0; g < groups; g += chunk) tasks.push_back({j, g, std::min(groups, g + chunk)});
    work += static_cast<double>(jb.w.out) * static_cast<double>(jb.w.in) * static_cast<double>(jb.n);
  }
  // Groups of 16 rows; pieces of at least 4 groups, which the kernels stream side by side.
  SplitTailTasks(
      tasks, work, [&](size_t j) { return 16.0 * static_cast<double>(jobs[j].w.in) * static_cast<double>(jobs[j].n); }, 4);
  // Workers must not name the thread_locals (theirs are other vectors).
  const RangeTask* task = tasks.data();
  const Mxfp4Activations* const* act = acts.data();
  // One row: the matrix-vector kernel (four streams of codes per thread).
  // More: the row tiles, which decode each line of codes once for up to 6
  // rows (AVX-512; elsewhere the matrix-vector kernel again). Both give each
  // row the same bits.
  auto run = [&](size_t i) {
    const Mxfp4MatVecJob& jb = jobs[task[i].job];
    (jb.n == 1 ? k.mxfp4_matvec : k.mxfp4_matvec_rows)(jb.w, *act[task[i].job], jb.Y, task[i].begin, task[i].end, 0,
                                                       jb.w.in / 32);
  };
  if (threads == 1 || work < 65536.0) {
    for (size_t i = 0; i < tasks.size(); ++i) run(i);
  } else {
    pool.ParallelFor(tasks.size(), run);
  }
}

}  // namespace cpu

}  // namespace moeserve::kernels

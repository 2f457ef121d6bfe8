// Google Benchmark for the CPU kernels at flagship-like shapes, every variant
// this CPU supports: MXFP4 matmul at batch 1 and 512 (the batch-512 runs are
// kept to few iterations), F32 matmul, RMSNorm; on AVX-512, the prefill GEMMs
// with BF16-rounded activations (matmul_*_bf16act) beside the fp32 ones; the
// chunked gated delta rule for one head. Counters: bytes/s (weights +
// activations read) and FLOP/s. `decode_rows/...` runs the products a
// batched decode step makes (1 to 64 activation rows, weights cold: cycled
// through copies larger than the last-level cache), for MXFP4 (the routed
// experts) and BF16 (the dense projections) weights. `indexer_int8_blocked/...`
// a long-context decode step's indexer scores, with `read_keys/...` the same
// bytes read plainly beside them. `mla_decode/...` one decode query of 4 or
// 8 heads over a 4,400-row latent cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <new>
#include <span>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../kernels/shapes.hpp"
#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/attention.hpp"
#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/delta_rule.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4_packed.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/kernels/weight_memory.hpp"

namespace mb = moeserve::bench;
namespace mk = moeserve::kernels;

namespace {

void SetCounters(benchmark::State& st, double bytes, double flops) {
  st.counters["bytes/s"] = benchmark::Counter(bytes * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["FLOP/s"] = benchmark::Counter(flops * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

void BM_Mxfp4MatMul(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n) {
  // Batch 1 cycles through copies so the weights come from memory, not cache.
  static std::vector<mb::Mxfp4Matrix> ms;  // one shape at a time
  static size_t mo = 0, mi = 0;
  const size_t copies = n == 1 ? mb::ColdCopies(mb::Mxfp4Bytes(out, in, 0)) : 1;
  if (mo != out || mi != in || ms.size() < copies) {
    ms.clear();
    for (size_t c = 0; c < copies; ++c) ms.push_back(mb::RandomMxfp4(out, in, static_cast<uint32_t>(c + 1)));
    mo = out;
    mi = in;
  }
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  size_t next = 0;
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    const mb::Mxfp4Matrix& m = ms[next++ % copies];
    k.matmul_mxfp4(m.view(), x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, mb::Mxfp4Bytes(out, in, n), mb::MatMulFlops(out, in, n));
}

// The prefill GEMMs with BF16-rounded activations (bf16_activations.hpp):
// MXFP4 or BF16 weights at a prefill batch; on AVX-512 with avx512_bf16 the
// vdpbf16ps GEMM, whose ceiling is twice the fp32 FMA peak.
void BM_Mxfp4MatMulBf16Act(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n) {
  const mb::Mxfp4Matrix m = mb::RandomMxfp4(out, in, 1);
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    k.matmul_mxfp4_bf16act(m.view(), x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, mb::Mxfp4Bytes(out, in, n), mb::MatMulFlops(out, in, n));
}

// The amx row's work that is not tiles (amx_tiles.hpp), on one thread:
// activations rounded and packed as B tiles (elements of X a second), and an
// MXFP4 matrix decoded to BF16 rows for the A tiles (weights a second). They
// run on AVX-512 with BF16, so any such CPU measures them.
void BM_AmxPackActivations(benchmark::State& st, size_t n, size_t in) {
  const std::vector<float> x = mb::RandomFloats(n * in);
  std::vector<uint16_t> packed(mk::AmxPackedActivationsElements(n, in));
  const size_t blocks = packed.size() / 512 / ((in + 31) / 32);
  for (auto _ : st) {
    mk::AmxPackActivations(x.data(), n, in, 0, blocks, packed.data());
    benchmark::DoNotOptimize(packed.data());
  }
  st.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(n * in) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

void BM_AmxDecodeMxfp4(benchmark::State& st, size_t out, size_t in) {
  const mb::Mxfp4Matrix m = mb::RandomMxfp4(out, in, 1);
  std::vector<uint16_t> rows(mk::kMxfp4PackRows * in);
  const size_t groups = mk::Mxfp4PackedGroups(out);
  for (auto _ : st) {
    for (size_t g = 0; g < groups; ++g) mk::AmxDecodeMxfp4Group(m.view(), g, rows.data(), in);
    benchmark::DoNotOptimize(rows.data());
  }
  st.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(out * in) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

std::vector<uint16_t> RandomBf16(size_t count, uint32_t seed) {
  const std::vector<float> f = mb::RandomFloats(count, seed);
  std::vector<uint16_t> w(count);
  for (size_t i = 0; i < count; ++i) w[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(f[i]) >> 16);
  return w;
}

// BF16 weights at a prefill batch: the fp32 path (matmul_bf16: widen, fp32
// GEMM) or the BF16-activation one.
void BM_Bf16MatMul(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n, bool bf16act) {
  const std::vector<uint16_t> w = RandomBf16(out * in, 7);
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    if (bf16act) k.matmul_bf16_bf16act(w.data(), out, in, x.data(), n, y.data());
    else k.matmul_bf16(w.data(), out, in, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, 2.0 * static_cast<double>(out * in) + 4.0 * static_cast<double>(n * in), mb::MatMulFlops(out, in, n));
}

// A batched decode step's product: n rows against weights read from memory
// (copies cycled so that none is in cache when it is used again; made once
// per shape for every row count, each a byte copy of the first).
template <class M>
const std::vector<M>& ColdSet(size_t out, size_t in, double bytes, M (*make)(size_t, size_t)) {
  static std::vector<M> set;
  static size_t so = 0, si = 0;
  if (so != out || si != in || set.empty()) {
    set.clear();
    set.push_back(make(out, in));
    for (size_t c = 1, copies = mb::ColdCopies(bytes); c < copies; ++c) set.push_back(set.front());
    so = out;
    si = in;
  }
  return set;
}

mb::Mxfp4Matrix MakeMxfp4(size_t out, size_t in) { return mb::RandomMxfp4(out, in, 1); }
std::vector<uint16_t> MakeBf16(size_t out, size_t in) { return RandomBf16(out * in, 7); }

void BM_DecodeRowsMxfp4(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n) {
  const std::vector<mb::Mxfp4Matrix>& ms = ColdSet(out, in, mb::Mxfp4Bytes(out, in, 0), MakeMxfp4);
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  size_t next = 0;
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    k.matmul_mxfp4(ms[next++ % ms.size()].view(), x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, mb::Mxfp4Bytes(out, in, n), mb::MatMulFlops(out, in, n));
}

void BM_DecodeRowsBf16(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n) {
  const std::vector<std::vector<uint16_t>>& ws = ColdSet(out, in, 2.0 * static_cast<double>(out * in), MakeBf16);
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  size_t next = 0;
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    k.matmul_bf16(ws[next++ % ws.size()].data(), out, in, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, 2.0 * static_cast<double>(out * in) + 4.0 * static_cast<double>(n * in), mb::MatMulFlops(out, in, n));
}

void BM_F32MatMul(benchmark::State& st, mk::Isa isa, size_t out, size_t in, size_t n) {
  // Batch 1 cycles through copies so the weights come from memory, not cache.
  const size_t copies = n == 1 ? mb::ColdCopies(4.0 * static_cast<double>(out * in)) : 1;
  std::vector<std::vector<float>> ws;
  for (size_t c = 0; c < copies; ++c) ws.push_back(mb::RandomFloats(out * in, static_cast<uint32_t>(c + 3)));
  std::vector<float> x = mb::RandomFloats(n * in), y(n * out);
  size_t next = 0;
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    k.matmul_f32(ws[next++ % copies].data(), out, in, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, 4.0 * static_cast<double>(out * in + n * in), mb::MatMulFlops(out, in, n));
}

void BM_RmsNorm(benchmark::State& st, mk::Isa isa, size_t d) {
  std::vector<float> x = mb::RandomFloats(d), w = mb::RandomFloats(d, 5), y(d);
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    k.rms_norm(x.data(), w.data(), 1e-6f, d, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(st, 8.0 * static_cast<double>(d), 4.0 * static_cast<double>(d));
}

// One head of the chunked delta rule over T tokens (q, k, v interleaved with
// the other heads' channels, as the engine lays them out), chunks of C.
// FLOP/s counts the recurrent form's logical work, 7 dk dv per token, as
// bench_prefill does.
void BM_DeltaRuleChunked(benchmark::State& st, mk::Isa isa, int T, int dk, int dv, int C) {
  const size_t stride = 2 * static_cast<size_t>(dk) + dv;
  std::vector<float> qkv = mb::RandomFloats(static_cast<size_t>(T) * stride), beta(T), g(T),
                     S0 = mb::RandomFloats(static_cast<size_t>(dk) * dv, 5), S(S0.size()), o(static_cast<size_t>(T) * dv);
  for (float& x : qkv) x *= 0.1f;  // |q|, |k| about 1 per row, as after the L2 norm
  for (int t = 0; t < T; ++t) {
    beta[t] = 0.5f;
    g[t] = -0.05f;
  }
  const float* q = qkv.data();
  const float* kk = q + dk;
  const float* v = kk + dk;
  const mk::KernelSet& k = mk::Kernels(isa);
  for (auto _ : st) {
    S = S0;
    k.delta_rule_chunked(q, kk, v, beta.data(), g.data(), T, dk, dv, stride, stride, S.data(), o.data(), dv, C);
    benchmark::DoNotOptimize(o.data());
  }
  SetCounters(st, 4.0 * static_cast<double>(T) * (stride + dv), 7.0 * T * dk * dv);
}

// Latent attention at the small preset's prefill shapes (8 heads, latent
// 256 + rope 32): a block of 64 queries over a 4,400-token cache, as DSA's
// sparse rows (each query its own top-2048 keys, drawn at random, ascending) or as a
// causal block at the cache's end (mla_decode, one head-query per lane).
// FLOP/s counts the logical work, 2 (2 kv_lora + rope) per head and key.
struct MlaCase {
  static constexpr int kHeads = 8, kLat = 256, kRope = 32, kCtx = 4400, kQueries = 64, kTopK = 2048;
  std::vector<float> cache = mb::RandomFloats(static_cast<size_t>(kCtx) * (kLat + kRope), 7);
  std::vector<const float*> rows;
  std::vector<float> q_abs = mb::RandomFloats(static_cast<size_t>(kQueries) * kHeads * kLat, 8),
                     q_pe = mb::RandomFloats(static_cast<size_t>(kQueries) * kHeads * kRope, 9),
                     lat = std::vector<float>(static_cast<size_t>(kQueries) * kHeads * kLat);
  std::vector<std::vector<int>> keys;
  std::vector<const int*> key_ptrs;
  std::vector<int> n_keys, visible;
  MlaCase() {
    for (int s = 0; s < kCtx; ++s) rows.push_back(&cache[static_cast<size_t>(s) * (kLat + kRope)]);
    std::mt19937 rng(3);
    std::vector<int> all(kCtx);
    for (int j = 0; j < kQueries; ++j) {
      const int seen = kCtx - kQueries + j + 1;
      all.resize(static_cast<size_t>(seen));
      for (int s = 0; s < seen; ++s) all[static_cast<size_t>(s)] = s;
      std::shuffle(all.begin(), all.end(), rng);
      keys.emplace_back(all.begin(), all.begin() + kTopK);
      std::sort(keys.back().begin(), keys.back().end());  // as TopKIndices writes them
      n_keys.push_back(kTopK);
      for (int h = 0; h < kHeads; ++h) visible.push_back(seen);
    }
    for (const auto& k : keys) key_ptrs.push_back(k.data());
  }
  mk::MlaDecodeShape Shape(bool causal) const {
    return {causal ? kHeads * kQueries : kHeads, kLat, kRope, 0.06f, causal ? visible.data() : nullptr};
  }
};

void BM_MlaAttention(benchmark::State& st, const mk::KernelSet* k, bool sparse) {
  static const MlaCase c;
  std::vector<float> lat(c.lat.size());
  double keys_seen = 0;
  for (int j = 0; j < MlaCase::kQueries; ++j) keys_seen += sparse ? MlaCase::kTopK : c.visible[static_cast<size_t>(j) * MlaCase::kHeads];
  for (auto _ : st) {
    if (sparse)
      k->mla_rows(c.Shape(false), MlaCase::kQueries, c.q_abs.data(), c.q_pe.data(), c.rows.data(), 0, c.key_ptrs.data(),
                  c.n_keys.data(), lat.data());
    else
      k->mla_decode(c.Shape(true), c.q_abs.data(), c.q_pe.data(), c.rows.data(), 0, nullptr, MlaCase::kCtx, lat.data());
    benchmark::DoNotOptimize(lat.data());
  }
  SetCounters(st, 4.0 * keys_seen * (MlaCase::kLat + MlaCase::kRope),
              2.0 * MlaCase::kHeads * keys_seen * (2.0 * MlaCase::kLat + MlaCase::kRope));
}

// One decode query of few heads (4: the tiny agent and the long preset; 8:
// the small preset) over the same 4,400 cached rows: mla_decode's path below
// the flash tiles' head count, a chunk's maxima and exponentials as one array
// (kernels/README.md, "Attention decode with few heads").
void BM_MlaDecodeFewHeads(benchmark::State& st, const mk::KernelSet* k, int heads) {
  static const MlaCase c;
  std::vector<float> lat(static_cast<size_t>(heads) * MlaCase::kLat);
  const mk::MlaDecodeShape shape{heads, MlaCase::kLat, MlaCase::kRope, 0.06f, nullptr};
  for (auto _ : st) {
    k->mla_decode(shape, c.q_abs.data(), c.q_pe.data(), c.rows.data(), 0, nullptr, MlaCase::kCtx, lat.data());
    benchmark::DoNotOptimize(lat.data());
  }
  SetCounters(st, 4.0 * MlaCase::kCtx * (MlaCase::kLat + MlaCase::kRope),
              2.0 * heads * MlaCase::kCtx * (2.0 * MlaCase::kLat + MlaCase::kRope));
}

// The DSA indexer over the same cache: 64 queries' scores (8 heads of 64)
// against their 4,337 .. 4,400 cached keys each, as one prefill block of
// sparse rows. FLOP/s counts 2 heads (dim + 1) per query and key.
void BM_IndexerBatch(benchmark::State& st, const mk::KernelSet* k) {
  constexpr int kHeads = 8, kDim = 64, kQueries = MlaCase::kQueries, kCtx = MlaCase::kCtx;
  static const std::vector<float> keys = mb::RandomFloats(static_cast<size_t>(kCtx) * kDim, 10);
  std::vector<const float*> rows;
  for (int s = 0; s < kCtx; ++s) rows.push_back(&keys[static_cast<size_t>(s) * kDim]);
  const std::vector<float> iq = mb::RandomFloats(static_cast<size_t>(kQueries) * kHeads * kDim, 11),
                           w = mb::RandomFloats(static_cast<size_t>(kQueries) * kHeads, 12);
  std::vector<int> n(kQueries);
  double keys_seen = 0;
  for (int j = 0; j < kQueries; ++j) keys_seen += n[static_cast<size_t>(j)] = kCtx - kQueries + j + 1;
  std::vector<float> scores(static_cast<size_t>(kQueries) * kCtx);
  for (auto _ : st) {
    k->indexer_scores_batch(iq.data(), w.data(), kQueries, kHeads, kDim, rows.data(), 0, n.data(), scores.data(), kCtx);
    benchmark::DoNotOptimize(scores.data());
  }
  SetCounters(st, 4.0 * kDim * kCtx, 2.0 * kHeads * (kDim + 1) * keys_seen);
}

// A decode step's int8 indexer over a blocked cache as the engine's striped
// pool holds it (16-key pool blocks, consecutive), one query: the long
// preset's 4 heads of 32 and the flagship's 64 of 128, over 64K keys (in the
// last-level cache) and 4M keys (long-preset keys: 151 MB, from memory).
// `read_keys/...` sums the same bytes with plain vector loads on the same
// threads: the ceiling a memory-bound indexer would reach. bytes/s: the
// keys' bytes (codes and scales).
// The keys sit in memory mapped as the pool's (kernels::AllocateZeroedPages:
// 2 MiB pages where the kernel gives them).
struct Int8BlockedCache {
  static constexpr int kBlockKeys = 16;
  std::span<float> pool;
  std::vector<const float*> blocks;
  Int8BlockedCache(int keys, int dim) {
    const size_t block_floats = mk::IndexerInt8KeyFloats(dim) * kBlockKeys;
    const size_t floats = static_cast<size_t>(keys) / kBlockKeys * block_floats;
    pool = {static_cast<float*>(mk::AllocateZeroedPages(floats * sizeof(float))), floats};
    if (pool.data() == nullptr) throw std::bad_alloc();
    const std::vector<float> k = mb::RandomFloats(static_cast<size_t>(dim) * 256, 13);
    for (int s = 0; s < keys; ++s)
      mk::StoreIndexerKeyInt8Blocked(&k[static_cast<size_t>(s % 256) * dim], dim, &pool[s / kBlockKeys * block_floats],
                                     kBlockKeys, s % kBlockKeys);
    for (size_t b = 0; b < pool.size(); b += block_floats) blocks.push_back(&pool[b]);
  }
  ~Int8BlockedCache() { mk::FreeZeroedPages(pool.data(), pool.size() * sizeof(float)); }
  Int8BlockedCache(const Int8BlockedCache&) = delete;
  Int8BlockedCache& operator=(const Int8BlockedCache&) = delete;
  static const Int8BlockedCache& Get(int keys, int dim) {
    static std::vector<std::pair<std::pair<int, int>, std::unique_ptr<Int8BlockedCache>>> made;
    for (const auto& [key, c] : made)
      if (key == std::pair{keys, dim}) return *c;
    made.emplace_back(std::pair{keys, dim}, std::make_unique<Int8BlockedCache>(keys, dim));
    return *made.back().second;
  }
};

void BM_IndexerInt8Blocked(benchmark::State& st, const mk::KernelSet* k, int keys, int heads, int dim) {
  const Int8BlockedCache& c = Int8BlockedCache::Get(keys, dim);
  const std::vector<float> q = mb::RandomFloats(static_cast<size_t>(heads) * dim, 14),
                           w = mb::RandomFloats(static_cast<size_t>(heads), 15);
  std::vector<int8_t> codes(q.size());
  std::vector<float> wt(static_cast<size_t>(heads));
  std::vector<int32_t> offset(static_cast<size_t>(heads));
  mk::QuantizeIndexerQueryInt8(q.data(), w.data(), heads, dim, codes.data(), wt.data(), offset.data());
  std::vector<float> scores(static_cast<size_t>(keys));
  for (auto _ : st) {
    k->indexer_scores_int8_blocked(mk::IndexerInt8Query{codes.data(), wt.data(), offset.data()}, 1, heads, dim,
                                   c.blocks.data(), Int8BlockedCache::kBlockKeys, &keys, scores.data(), scores.size());
    benchmark::DoNotOptimize(scores.data());
  }
  SetCounters(st, 4.0 * static_cast<double>(c.pool.size()), 2.0 * heads * (dim + 1) * static_cast<double>(keys));
}

void BM_ReadKeys(benchmark::State& st, int keys, int dim) {
  const Int8BlockedCache& c = Int8BlockedCache::Get(keys, dim);
  constexpr size_t kPieces = 64;
  const size_t per = c.pool.size() / kPieces;
  std::vector<float> sums(kPieces);
  for (auto _ : st) {
    mk::DefaultThreadPool().ParallelFor(kPieces, [&](size_t i) {
      const float* p = c.pool.data() + i * per;
      float a[16] = {};
      for (size_t j = 0; j + 16 <= per; j += 16)
        for (int l = 0; l < 16; ++l) a[l] += p[j + static_cast<size_t>(l)];
      float t = 0;
      for (float x : a) t += x;
      sums[i] = t;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  SetCounters(st, 4.0 * static_cast<double>(c.pool.size()), 0);
}

int Register() {
  for (mk::Isa isa : mk::SupportedIsas()) {
    if (!mk::IsaServes(isa)) continue;  // the rows for tests (the reference, amx_model)
    const std::string v = mk::IsaName(isa);
    // Batched decode: the small preset's expert (768 x 1024) and gpt-oss-20b's
    // expert down projection (2880 x 2880) in MXFP4; projections of 1024 x
    // 1024 and gpt-oss's 4096 x 2880 query projection in BF16.
    constexpr size_t kDecodeRows[] = {1, 2, 4, 8, 16, 32, 64};
    if (isa != mk::Isa::kScalar) {
      for (const auto& s : {mb::MatShape{"768x1024", 768, 1024}, mb::MatShape{"2880x2880", 2880, 2880}})
        for (size_t n : kDecodeRows)
          benchmark::RegisterBenchmark(("decode_rows_mxfp4/" + v + "/" + s.name + "/n" + std::to_string(n)).c_str(),
                                       BM_DecodeRowsMxfp4, isa, s.out, s.in, n)
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.2)
              ->UseRealTime();
      for (const auto& s : {mb::MatShape{"1024x1024", 1024, 1024}, mb::MatShape{"4096x2880", 4096, 2880}})
        for (size_t n : kDecodeRows)
          benchmark::RegisterBenchmark(("decode_rows_bf16/" + v + "/" + s.name + "/n" + std::to_string(n)).c_str(),
                                       BM_DecodeRowsBf16, isa, s.out, s.in, n)
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.2)
              ->UseRealTime();
      // A DeepSeek-V3.2 routed expert's BF16 projections at one row (the
      // gate or up projection, 2048 x 7168, and the down one, 7168 x 2048).
      for (const auto& s : {mb::MatShape{"2048x7168", 2048, 7168}, mb::MatShape{"7168x2048", 7168, 2048}})
        benchmark::RegisterBenchmark(("decode_rows_bf16/" + v + "/" + s.name + "/n1").c_str(), BM_DecodeRowsBf16, isa,
                                     s.out, s.in, size_t{1})
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.2)
            ->UseRealTime();
    }
    for (const auto& s : mb::kMxfp4Shapes) {
      benchmark::RegisterBenchmark(("mxfp4_matmul/" + v + "/" + s.name + "/n1").c_str(), BM_Mxfp4MatMul, isa, s.out, s.in,
                                   size_t{1})
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5)
          ->UseRealTime();
      if (isa == mk::Isa::kScalar) continue;  // the scalar GEMM at batch 512 takes minutes
      benchmark::RegisterBenchmark(("mxfp4_matmul/" + v + "/" + s.name + "/n512").c_str(), BM_Mxfp4MatMul, isa, s.out,
                                   s.in, size_t{512})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(2)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("f32_matmul/" + v + "/2048x2048/n1").c_str(), BM_F32MatMul, isa, size_t{2048},
                                 size_t{2048}, size_t{1})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    if (isa != mk::Isa::kScalar)
      benchmark::RegisterBenchmark(("f32_matmul/" + v + "/2048x2048/n128").c_str(), BM_F32MatMul, isa, size_t{2048},
                                   size_t{2048}, size_t{128})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3)
          ->UseRealTime();
    benchmark::RegisterBenchmark(("rms_norm/" + v + "/7168").c_str(), BM_RmsNorm, isa, size_t{7168});
    // The small preset's head (dk 64, dv 128) over a 512-token prefill chunk.
    for (int C : {32, 64})
      benchmark::RegisterBenchmark(("delta_rule_chunked/" + v + "/64x128/T512/C" + std::to_string(C)).c_str(),
                                   BM_DeltaRuleChunked, isa, 512, 64, 128, C)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
    for (bool sparse : {true, false})
      benchmark::RegisterBenchmark(
          ((sparse ? "mla_rows/" : "mla_causal/") + v + "/8h_64q_ctx4400" + (sparse ? "_top2048" : "")).c_str(),
          BM_MlaAttention, &mk::Kernels(isa), sparse)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.3)
          ->UseRealTime();
    for (int heads : {4, 8})
      benchmark::RegisterBenchmark(("mla_decode/" + v + "/" + std::to_string(heads) + "h_ctx4400").c_str(),
                                   BM_MlaDecodeFewHeads, &mk::Kernels(isa), heads)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3)
          ->UseRealTime();
    benchmark::RegisterBenchmark(("indexer_batch/" + v + "/8x64_64q_ctx4400").c_str(), BM_IndexerBatch, &mk::Kernels(isa))
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.3)
        ->UseRealTime();
    for (const auto& [keys, heads, dim, name] :
         {std::tuple{65536, 4, 32, "4x32_64k"}, std::tuple{4194304, 4, 32, "4x32_4m"}, std::tuple{65536, 64, 128, "64x128_64k"}})
      benchmark::RegisterBenchmark(("indexer_int8_blocked/" + v + "/" + name).c_str(), BM_IndexerInt8Blocked,
                                   &mk::Kernels(isa), keys, heads, dim)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3)
          ->UseRealTime();
    // BF16 experts with BF16 activations at Qwen3-Next-80B-A3B's shapes (its
    // experts' up/gate 512 x 2048 and down 2048 x 512; ~80 rows an expert in
    // a 512-token chunk): the AVX-512 vdpbf16ps GEMM and the amx row's tiles.
    if (isa == mk::Isa::kAvx512 || isa == mk::Isa::kAmx)
      for (const auto& [out, in] : {std::pair<size_t, size_t>{512, 2048}, std::pair<size_t, size_t>{2048, 512}})
        for (size_t n : {size_t{80}, size_t{512}})
          benchmark::RegisterBenchmark(("bf16_matmul_bf16act/" + v + "/" + std::to_string(out) + "x" +
                                        std::to_string(in) + "/n" + std::to_string(n))
                                           .c_str(),
                                       BM_Bf16MatMul, isa, out, in, n, true)
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.2)
              ->UseRealTime();
    if (isa != mk::Isa::kAvx512) continue;  // elsewhere the bf16act rows are the fp32 GEMM again
    if (mk::CpuHasAvx512Bf16())
      for (bool sparse : {true, false})
        benchmark::RegisterBenchmark(
            ((sparse ? "mla_rows_bf16act/" : "mla_causal_bf16act/") + v + "/8h_64q_ctx4400" + (sparse ? "_top2048" : ""))
                .c_str(),
            BM_MlaAttention, &mk::KernelsWithBf16Activations(isa), sparse)
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.3)
            ->UseRealTime();
    // Flagship shapes at batch 512, and the small preset's expert (w13:
    // 768 x 1024) at 512 and at 64 rows (a 512-token chunk over 32 experts,
    // 4 each) and its 1024 x 1024-class projections with BF16 weights.
    for (const auto& s : mb::kMxfp4Shapes)
      benchmark::RegisterBenchmark(("mxfp4_matmul_bf16act/" + v + "/" + s.name + "/n512").c_str(), BM_Mxfp4MatMulBf16Act,
                                   isa, s.out, s.in, size_t{512})
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3)
          ->UseRealTime();
    for (size_t n : {size_t{512}, size_t{64}}) {
      benchmark::RegisterBenchmark(("mxfp4_matmul/" + v + "/768x1024/n" + std::to_string(n)).c_str(), BM_Mxfp4MatMul, isa,
                                   size_t{768}, size_t{1024}, n)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("mxfp4_matmul_bf16act/" + v + "/768x1024/n" + std::to_string(n)).c_str(),
                                   BM_Mxfp4MatMulBf16Act, isa, size_t{768}, size_t{1024}, n)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2)
          ->UseRealTime();
    }
    for (bool bf16act : {false, true})
      benchmark::RegisterBenchmark(
          ((bf16act ? "bf16_matmul_bf16act/" : "bf16_matmul/") + v + "/1024x1024/n512").c_str(), BM_Bf16MatMul, isa,
          size_t{1024}, size_t{1024}, size_t{512}, bf16act)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2)
          ->UseRealTime();
  }
  if (mk::CpuHasAvx512Bf16()) {
    for (size_t in : {size_t{2048}, size_t{7168}})
      benchmark::RegisterBenchmark(("amx_pack_activations/n512x" + std::to_string(in)).c_str(), BM_AmxPackActivations,
                                   size_t{512}, in)
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.2)
          ->UseRealTime();
    for (const auto& s : mb::kMxfp4Shapes)
      benchmark::RegisterBenchmark((std::string("amx_decode_mxfp4/") + s.name).c_str(), BM_AmxDecodeMxfp4, s.out, s.in)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.2)
          ->UseRealTime();
  }
  for (const auto& [keys, dim, name] : {std::tuple{65536, 32, "4x32_64k"}, std::tuple{4194304, 32, "4x32_4m"}})
    benchmark::RegisterBenchmark((std::string("read_keys/") + name).c_str(), BM_ReadKeys, keys, dim)
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.3)
        ->UseRealTime();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

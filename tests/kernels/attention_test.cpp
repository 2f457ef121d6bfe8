// Decode attention kernels: every variant of the mla_decode, indexer_scores
// and indexer_scores_batch families this CPU supports against their references on
// random caches (paged: non-contiguous rows), odd sizes, sparse key sets;
// top-k selection against a full sort.
#include "moeserve/kernels/attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "each_variant.hpp"
#include "moeserve/kernels/bf16_activations.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::kernels {
namespace {

struct PagedRows {
  std::vector<std::vector<float>> blocks;
  std::vector<const float*> rows;
  // n rows of `width` floats in blocks of 16 rows, visited in a shuffled block order.
  PagedRows(int n, int width, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    const int nb = (n + 15) / 16;
    std::vector<int> order(static_cast<size_t>(nb));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    blocks.resize(static_cast<size_t>(nb));
    for (auto& b : blocks) {
      b.resize(16u * static_cast<size_t>(width));
      for (auto& x : b) x = d(rng);
    }
    for (int i = 0; i < n; ++i) rows.push_back(&blocks[static_cast<size_t>(order[i / 16])][static_cast<size_t>(i % 16) * width]);
  }
};

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  double mx = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);  // a NaN must fail, not vanish in max
  }
  EXPECT_LE(diff, rel * mx) << "max diff " << diff << " of " << mx;
}

// Queries of H heads each (q_abs, q_pe: [queries * H] rows) over a paged
// cache of n rows, this layer's data at `offset` in each.
struct HeadQueries {
  int hq;
  PagedRows cache;
  std::vector<float> q_abs, q_pe;
  HeadQueries(int queries, int H, int kvl, int rope, int n, int offset, std::mt19937& rng)
      : hq(queries * H),
        cache(n, offset + kvl + rope, rng),
        q_abs(Random(static_cast<size_t>(hq) * kvl, rng, 0.3f)),
        q_pe(Random(static_cast<size_t>(hq) * rope, rng, 0.3f)) {}
};

TEST(MlaDecodeKernel, FastMatchesReference) {
  std::mt19937 rng(1);
  for (auto [heads, kvl, rope, n] : {std::tuple{4, 64, 16, 1}, std::tuple{3, 37, 6, 5}, std::tuple{16, 128, 32, 1000},
                                     std::tuple{128, 512, 64, 300}, std::tuple{1, 1, 2, 17}, std::tuple{12, 40, 8, 33}}) {
    const int offset = 3;  // this layer's data does not start the row
    PagedRows cache(n, offset + kvl + rope, rng);
    auto q_abs = Random(static_cast<size_t>(heads) * kvl, rng, 0.2f);
    auto q_pe = Random(static_cast<size_t>(heads) * rope, rng, 0.2f);
    MlaDecodeShape shape{heads, kvl, rope, 0.35f};
    std::vector<float> ref(static_cast<size_t>(heads) * kvl), fast(ref.size());
    std::vector<int> keys;  // a sparse key set
    for (int i = 0; i < n; i += 3) keys.push_back(i);
    ForEachVariant("mla_decode", [&](const KernelSet& k) {
      SCOPED_TRACE(k.mla_decode.name);
      MlaDecodeRef(shape, q_abs.data(), q_pe.data(), cache.rows.data(), offset, nullptr, n, ref.data());
      std::fill(fast.begin(), fast.end(), NAN);
      k.mla_decode(shape, q_abs.data(), q_pe.data(), cache.rows.data(), offset, nullptr, n, fast.data());
      ExpectClose(fast, ref, 1e-5);
      MlaDecodeRef(shape, q_abs.data(), q_pe.data(), cache.rows.data(), offset, keys.data(), static_cast<int>(keys.size()), ref.data());
      std::fill(fast.begin(), fast.end(), NAN);
      k.mla_decode(shape, q_abs.data(), q_pe.data(), cache.rows.data(), offset, keys.data(), static_cast<int>(keys.size()), fast.data());
      ExpectClose(fast, ref, 1e-5);
    });
  }
}

TEST(MlaDecodeKernel, FewHeadsMatchReference) {
  // 1, 2, 4, 8 and 16 heads: the AVX-512 set takes a chunk's scores as one
  // array (a vector holds whole keys; maxima and exponentials over the run,
  // two keys' four-head scores by one tree). Key counts odd and even, below,
  // at and across the kernel's chunks; without and with per-head limits.
  std::mt19937 rng(11);
  for (int H : {1, 2, 4, 8, 16}) {
    for (int n : {1, 2, 3, 255, 1001}) {
      SCOPED_TRACE("heads " + std::to_string(H) + ", keys " + std::to_string(n));
      const int kvl = 64, rope = 8, offset = 3;
      HeadQueries b(1, H, kvl, rope, n, offset, rng);
      std::vector<int> visible(static_cast<size_t>(H));
      for (int h = 0; h < H; ++h) visible[static_cast<size_t>(h)] = 1 + (h * 7919) % n;
      std::vector<int> keys;  // a sparse key set, descending
      for (int i = n - 1; i >= 0; i -= 3) keys.push_back(i);
      const int n_list = static_cast<int>(keys.size());
      const MlaDecodeShape plain{H, kvl, rope, 0.3f}, limited{H, kvl, rope, 0.3f, visible.data()};
      // Scores of hundreds: e^(s - max) overflows unless every head's max is
      // its own true maximum (with small scores any shift gives the same
      // weights). Their rounding moves the weights by about 1e-4 of the
      // output; a wrong maximum makes it infinite.
      std::vector<float> loud(b.q_abs);
      for (float& x : loud) x *= 400.0f;
      std::vector<float> ref(static_cast<size_t>(H) * kvl), fast(ref.size());
      ForEachVariant("mla_decode", [&](const KernelSet& k) {
        SCOPED_TRACE(k.mla_decode.name);
        for (const MlaDecodeShape* shape : {&plain, &limited}) {
          for (const std::vector<float>* q_abs : {&b.q_abs, &loud}) {
            MlaDecodeRef(*shape, q_abs->data(), b.q_pe.data(), b.cache.rows.data(), offset, nullptr, n, ref.data());
            std::fill(fast.begin(), fast.end(), NAN);
            k.mla_decode(*shape, q_abs->data(), b.q_pe.data(), b.cache.rows.data(), offset, nullptr, n, fast.data());
            ExpectClose(fast, ref, q_abs == &loud ? 1e-3 : 1e-5);
          }
        }
        MlaDecodeRef(plain, b.q_abs.data(), b.q_pe.data(), b.cache.rows.data(), offset, keys.data(), n_list, ref.data());
        std::fill(fast.begin(), fast.end(), NAN);
        k.mla_decode(plain, b.q_abs.data(), b.q_pe.data(), b.cache.rows.data(), offset, keys.data(), n_list, fast.data());
        ExpectClose(fast, ref, 1e-5);
      });
    }
  }
}

TEST(MlaDecodeKernel, ScatteredShortRowsMatchReference) {
  // A long context's top-k list: short rows (80 floats) far apart in one
  // buffer, so the AVX-512 set's flash tiles (mla_rows, a decode step's
  // sparse attention) prefetch each next block of rows themselves; a list of
  // 300 (three blocks of 96 and a part), as the engine passes it (its own
  // rows, numbered 0, 1, ...) and as keys into the whole cache. mla_decode
  // (the dense step, here its split over keys) is held to the same.
  std::mt19937 rng(11);
  const int heads = 4, kvl = 64, rope = 16, n = 300, gap = 4096, offset = 5;
  std::vector<float> buffer(static_cast<size_t>(n) * gap);
  for (float& v : buffer) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  std::vector<const float*> all(static_cast<size_t>(n) * 4), selected;
  std::vector<int> keys, renumbered;
  for (int i = 0; i < n; ++i) {
    all[static_cast<size_t>(i) * 4] = &buffer[static_cast<size_t>(i) * gap];
    keys.push_back(i * 4);
    selected.push_back(all[static_cast<size_t>(i) * 4]);
    renumbered.push_back(i);
  }
  for (size_t i = 0; i < all.size(); ++i)
    if (!all[i]) all[i] = &buffer[0];
  auto q_abs = Random(static_cast<size_t>(heads) * kvl, rng, 0.3f);
  auto q_pe = Random(static_cast<size_t>(heads) * rope, rng, 0.3f);
  const MlaDecodeShape shape{heads, kvl, rope, 0.3f};
  std::vector<float> ref(static_cast<size_t>(heads) * kvl), fast(ref.size());
  MlaDecodeRef(shape, q_abs.data(), q_pe.data(), all.data(), offset, keys.data(), n, ref.data());
  const int* key_list = keys.data();
  const int* renumbered_list = renumbered.data();
  ForEachVariant("mla_rows", [&](const KernelSet& k) {
    SCOPED_TRACE(k.mla_rows.name);
    std::fill(fast.begin(), fast.end(), NAN);
    k.mla_rows(shape, 1, q_abs.data(), q_pe.data(), all.data(), offset, &key_list, &n, fast.data());
    ExpectClose(fast, ref, 1e-5);
    std::fill(fast.begin(), fast.end(), NAN);
    k.mla_rows(shape, 1, q_abs.data(), q_pe.data(), selected.data(), offset, &renumbered_list, &n, fast.data());
    ExpectClose(fast, ref, 1e-5);
  });
  ForEachVariant("mla_decode", [&](const KernelSet& k) {
    SCOPED_TRACE(k.mla_decode.name);
    std::fill(fast.begin(), fast.end(), NAN);
    k.mla_decode(shape, q_abs.data(), q_pe.data(), selected.data(), offset, renumbered.data(), n, fast.data());
    ExpectClose(fast, ref, 1e-5);
  });
}

TEST(MlaDecodeKernel, VisibleKeysPerHeadEqualSeparateCalls) {
  // Three queries of 8 heads each as one call of 24 heads, query j seeing the
  // first visible[j] keys (causal prefill), against one call per query.
  std::mt19937 rng(4);
  const int H = 8, kvl = 48, rope = 16, n = 300, queries = 3;
  const int sees[queries] = {1, 150, 300};
  PagedRows cache(n, 2 + kvl + rope, rng);
  auto q_abs = Random(static_cast<size_t>(queries) * H * kvl, rng, 0.3f);
  auto q_pe = Random(static_cast<size_t>(queries) * H * rope, rng, 0.3f);
  std::vector<int> visible;
  for (int j = 0; j < queries; ++j) visible.insert(visible.end(), H, sees[j]);
  MlaDecodeShape joint{queries * H, kvl, rope, 0.2f, visible.data()};
  std::vector<float> want(static_cast<size_t>(queries) * H * kvl);
  for (int j = 0; j < queries; ++j)
    MlaDecodeRef({H, kvl, rope, 0.2f}, &q_abs[static_cast<size_t>(j) * H * kvl], &q_pe[static_cast<size_t>(j) * H * rope],
                 cache.rows.data(), 2, nullptr, sees[j], &want[static_cast<size_t>(j) * H * kvl]);
  std::vector<float> got(want.size());
  MlaDecodeRef(joint, q_abs.data(), q_pe.data(), cache.rows.data(), 2, nullptr, n, got.data());
  ExpectClose(got, want, 1e-6);
  ForEachVariant("mla_decode", [&](const KernelSet& k) {
    std::fill(got.begin(), got.end(), NAN);
    k.mla_decode(joint, q_abs.data(), q_pe.data(), cache.rows.data(), 2, nullptr, n, got.data());
    ExpectClose(got, want, 1e-5);
  });
}

TEST(MlaDecodeKernel, ManyHeadQueriesCausalMatchReference) {
  // Calls of many head-queries (the fast set takes them as vector lanes in
  // tiles of 32): causal limits that stop inside and at the ends of key
  // blocks, a partial last tile, latent widths not a multiple of the
  // 8-column tile, key counts not a multiple of the 8-key tile; dense and
  // through a sparse key list.
  std::mt19937 rng(7);
  for (auto [queries, H, kvl, rope, n] : {std::tuple{130, 8, 64, 16, 700}, std::tuple{37, 16, 36, 6, 97},
                                          std::tuple{2, 128, 256, 32, 150}, std::tuple{300, 1, 20, 4, 49}}) {
    HeadQueries b(queries, H, kvl, rope, n, 1, rng);
    const int hq = b.hq;
    const PagedRows& cache = b.cache;
    const std::vector<float>&q_abs = b.q_abs, &q_pe = b.q_pe;
    std::vector<int> visible;
    std::uniform_int_distribution<int> sees(1, n);
    for (int j = 0; j < queries; ++j) visible.insert(visible.end(), static_cast<size_t>(H), j == 0 ? 1 : sees(rng));
    std::vector<int> keys;
    for (int i = n - 1; i >= 0; i -= 2) keys.push_back(i);  // descending: the list order is what `visible` counts
    const int n_list = static_cast<int>(keys.size());
    std::vector<int> visible_list(visible);
    for (int& v : visible_list) v = std::min(v, n_list);
    const MlaDecodeShape dense{hq, kvl, rope, 0.3f, visible.data()}, sparse{hq, kvl, rope, 0.3f, visible_list.data()};
    std::vector<float> ref(static_cast<size_t>(hq) * kvl), fast(ref.size());
    ForEachVariant("mla_decode", [&](const KernelSet& k) {
      SCOPED_TRACE(k.mla_decode.name);
      MlaDecodeRef(dense, q_abs.data(), q_pe.data(), cache.rows.data(), 1, nullptr, n, ref.data());
      std::fill(fast.begin(), fast.end(), NAN);
      k.mla_decode(dense, q_abs.data(), q_pe.data(), cache.rows.data(), 1, nullptr, n, fast.data());
      ExpectClose(fast, ref, 1e-5);
      MlaDecodeRef(sparse, q_abs.data(), q_pe.data(), cache.rows.data(), 1, keys.data(), n_list, ref.data());
      std::fill(fast.begin(), fast.end(), NAN);
      k.mla_decode(sparse, q_abs.data(), q_pe.data(), cache.rows.data(), 1, keys.data(), n_list, fast.data());
      ExpectClose(fast, ref, 1e-5);
    });
  }
}

TEST(MlaRowsKernel, FastMatchesReference) {
  // Queries with their own key lists (DSA's sparse rows): head counts for
  // each lane width of the AVX-512 form (8, 16, 32 per tile) and odd ones,
  // list lengths from 1 key to several blocks, not multiples of the tiles.
  std::mt19937 rng(11);
  for (auto [queries, H, kvl, rope, n] : {std::tuple{5, 8, 64, 16, 400}, std::tuple{3, 16, 40, 8, 130},
                                          std::tuple{2, 40, 48, 6, 77}, std::tuple{7, 3, 24, 4, 60},
                                          std::tuple{4, 5, 21, 4, 90}, std::tuple{3, 4, 19, 4, 70}}) {
    // (5 heads over rows of 25: an odd row, whose last element has no
    // partner in the few-heads tile's paired scores, and 21 latent columns;
    // 4 heads over rows of 23, 3 elements past the last group of 4.)
    HeadQueries b(queries, H, kvl, rope, n, 2, rng);
    const size_t hq = static_cast<size_t>(b.hq);
    const PagedRows& cache = b.cache;
    const std::vector<float>&q_abs = b.q_abs, &q_pe = b.q_pe;
    std::vector<std::vector<int>> lists(static_cast<size_t>(queries));
    std::vector<const int*> keys;
    std::vector<int> n_keys;
    for (int j = 0; j < queries; ++j) {
      std::vector<int> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const int len = j == 0 ? 1 : std::uniform_int_distribution<int>(1, n)(rng);
      lists[static_cast<size_t>(j)].assign(all.begin(), all.begin() + len);
      keys.push_back(lists[static_cast<size_t>(j)].data());
      n_keys.push_back(len);
    }
    const MlaDecodeShape shape{H, kvl, rope, 0.3f};
    std::vector<float> ref(hq * kvl), fast(ref.size());
    MlaRowsRef(shape, queries, q_abs.data(), q_pe.data(), cache.rows.data(), 2, keys.data(), n_keys.data(), ref.data());
    ForEachVariant("mla_rows", [&](const KernelSet& k) {
      SCOPED_TRACE(k.mla_rows.name);
      std::fill(fast.begin(), fast.end(), NAN);
      k.mla_rows(shape, queries, q_abs.data(), q_pe.data(), cache.rows.data(), 2, keys.data(), n_keys.data(), fast.data());
      ExpectClose(fast, ref, 1e-5);
    });
  }
}

TEST(MlaBf16DotKernel, CloseToReferenceAndRunsAsBf16) {
  // The BF16-activation set's attention: BF16 dot products (queries, rows
  // and weights rounded to BF16) where the CPU has them. Within BF16's
  // rounding of the reference, and not the fp32 kernels' result (so the
  // dot-product path is what ran).
  if (!CpuHasAvx512Bf16() || !IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  const KernelSet& fp32 = Kernels(Isa::kAvx512);
  const KernelSet& bf16 = KernelsWithBf16Activations(Isa::kAvx512);
  std::mt19937 rng(12);
  for (auto [queries, H, kvl, rope, n] : {std::tuple{130, 8, 64, 16, 300}, std::tuple{3, 40, 50, 7, 101},
                                          std::tuple{9, 8, 256, 32, 97}, std::tuple{4, 16, 30, 6, 49},
                                          std::tuple{7, 3, 50, 7, 77}}) {
    // (3 heads of 50 latent columns: pad lanes, and a run of 32 columns
    // then a masked remainder, in the few-heads rows kernel.)
    HeadQueries b(queries, H, kvl, rope, n, 1, rng);
    const int hq = b.hq;
    const PagedRows& cache = b.cache;
    const std::vector<float>&q_abs = b.q_abs, &q_pe = b.q_pe;
    std::vector<int> visible;
    for (int j = 0; j < queries; ++j) visible.insert(visible.end(), static_cast<size_t>(H), 1 + j * (n - 1) / queries);
    std::vector<std::vector<int>> lists(static_cast<size_t>(queries));
    std::vector<const int*> keys;
    std::vector<int> n_keys;
    for (int j = 0; j < queries; ++j) {
      for (int i = j % 3; i < n; i += 1 + j % 3) lists[static_cast<size_t>(j)].push_back(i);
      keys.push_back(lists[static_cast<size_t>(j)].data());
      n_keys.push_back(static_cast<int>(lists[static_cast<size_t>(j)].size()));
    }
    const MlaDecodeShape causal{hq, kvl, rope, 0.3f, visible.data()}, per_query{H, kvl, rope, 0.3f};
    std::vector<float> ref(static_cast<size_t>(hq) * kvl), got(ref.size()), f32(ref.size());
    auto check = [&](const char* what) {
      SCOPED_TRACE(what);
      ExpectClose(got, ref, 1e-2);  // BF16 keeps 8 significant bits
      double differs = 0;
      for (size_t i = 0; i < got.size(); ++i) differs = std::max(differs, std::fabs(static_cast<double>(got[i]) - f32[i]));
      EXPECT_GT(differs, 0.0);
    };
    if (hq >= 64 * DefaultThreadPool().size()) {  // as many head-queries as prefill's causal blocks
      MlaDecodeRef(causal, q_abs.data(), q_pe.data(), cache.rows.data(), 1, nullptr, n, ref.data());
      fp32.mla_decode(causal, q_abs.data(), q_pe.data(), cache.rows.data(), 1, nullptr, n, f32.data());
      bf16.mla_decode(causal, q_abs.data(), q_pe.data(), cache.rows.data(), 1, nullptr, n, got.data());
      check("causal block");
    }
    MlaRowsRef(per_query, queries, q_abs.data(), q_pe.data(), cache.rows.data(), 1, keys.data(), n_keys.data(), ref.data());
    fp32.mla_rows(per_query, queries, q_abs.data(), q_pe.data(), cache.rows.data(), 1, keys.data(), n_keys.data(), f32.data());
    bf16.mla_rows(per_query, queries, q_abs.data(), q_pe.data(), cache.rows.data(), 1, keys.data(), n_keys.data(), got.data());
    check("own key lists");
  }
}

TEST(MlaBf16DotKernel, LongContextBufferIsReleasedAfterTheCall) {
  // A context whose rounded rows outgrow the kept buffer (one long prompt)
  // must not leave the thread holding that memory; a short one keeps its
  // buffer for the next call.
  if (!CpuHasAvx512Bf16() || !IsaSupported(Isa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  const KernelSet& bf16 = KernelsWithBf16Activations(Isa::kAvx512);
  std::mt19937 rng(13);
  const int H = 8, kvl = 512, rope = 64;
  const int n_long = static_cast<int>(kAttentionScratchKeepBytes / ((kvl + rope) / 2 * 4)) + 1000;
  for (int n : {n_long, 100}) {
    HeadQueries b(1, H, kvl, rope, n, 0, rng);
    std::vector<int> keys(static_cast<size_t>(n));
    std::iota(keys.begin(), keys.end(), 0);
    const int* list = keys.data();
    std::vector<float> got(static_cast<size_t>(H) * kvl);
    const MlaDecodeShape shape{H, kvl, rope, 0.3f};
    bf16.mla_rows(shape, 1, b.q_abs.data(), b.q_pe.data(), b.cache.rows.data(), 0, &list, &n, got.data());
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
    EXPECT_LE(AttentionScratchHeldBytes(), kAttentionScratchKeepBytes) << n << " rows";
    if (n < n_long) {
      EXPECT_GT(AttentionScratchHeldBytes(), 0u) << "a short call keeps its buffer";
    }
  }
}

TEST(MlaDecodeKernel, ReferenceIsSoftmaxWeightedLatent) {
  // Two keys, one head, scores 0 and ln 3: weights 1/4 and 3/4.
  std::vector<float> r0 = {1, 0, 0, 0}, r1 = {0, 1, std::log(3.0f), 0};
  const float* rows[] = {r0.data(), r1.data()};
  std::vector<float> q_abs = {0, 0}, q_pe = {1, 0}, lat(2);
  MlaDecodeRef({1, 2, 2, 1.0f}, q_abs.data(), q_pe.data(), rows, 0, nullptr, 2, lat.data());
  EXPECT_NEAR(lat[0], 0.25f, 1e-6);
  EXPECT_NEAR(lat[1], 0.75f, 1e-6);
}

TEST(IndexerKernel, FastMatchesReference) {
  std::mt19937 rng(2);
  // Head counts around the AVX-512 variant's 8 per pass (and its 4-head
  // pairs), key counts odd and even (it takes two keys per pass over the queries).
  for (auto [heads, dim, n] : {std::tuple{4, 32, 1}, std::tuple{64, 128, 5000}, std::tuple{3, 19, 77}, std::tuple{8, 64, 9},
                               std::tuple{9, 17, 2}, std::tuple{16, 33, 300}, std::tuple{1, 1, 3}, std::tuple{4, 16, 301},
                               std::tuple{4, 40, 2}}) {
    PagedRows cache(n, dim + 5, rng);
    auto iq = Random(static_cast<size_t>(heads) * dim, rng);
    auto w = Random(static_cast<size_t>(heads), rng);
    std::vector<float> ref(static_cast<size_t>(n)), fast(ref.size());
    IndexerScoresRef(iq.data(), w.data(), heads, dim, cache.rows.data(), 5, n, ref.data());
    ForEachVariant("indexer_scores", [&](const KernelSet& k) {
      SCOPED_TRACE(k.indexer_scores.name);
      std::fill(fast.begin(), fast.end(), NAN);
      k.indexer_scores(iq.data(), w.data(), heads, dim, cache.rows.data(), 5, n, fast.data());
      ExpectClose(fast, ref, 1e-5);
    });
  }
}

TEST(IndexerKernel, BatchMatchesOneQueryAtATime) {
  std::mt19937 rng(4);
  // Query counts around the engine's blocks, heads around the AVX-512
  // variant's 4 per pass, key counts off its 32-key blocks; each query sees
  // its own causal prefix (n rising by one per query), the rest of its
  // output row must stay untouched.
  for (auto [queries, heads, dim, n0] : {std::tuple{16, 8, 64, 2049}, std::tuple{5, 3, 17, 40}, std::tuple{1, 9, 33, 31},
                                         std::tuple{7, 4, 64, 1}, std::tuple{3, 1, 1, 70}}) {
    const int n_max = n0 + queries - 1;
    PagedRows cache(n_max, dim + 5, rng);
    auto iq = Random(static_cast<size_t>(queries) * heads * dim, rng);
    auto w = Random(static_cast<size_t>(queries) * heads, rng);
    std::vector<int> n(static_cast<size_t>(queries));
    for (int q = 0; q < queries; ++q) n[static_cast<size_t>(q)] = n0 + q;
    const size_t ld = static_cast<size_t>(n_max) + 3;
    std::vector<float> ref(static_cast<size_t>(queries) * ld, -7.0f);
    for (int q = 0; q < queries; ++q)
      IndexerScoresRef(&iq[static_cast<size_t>(q) * heads * dim], &w[static_cast<size_t>(q) * heads], heads, dim,
                       cache.rows.data(), 5, n[static_cast<size_t>(q)], &ref[static_cast<size_t>(q) * ld]);
    ForEachVariant("indexer_scores_batch", [&](const KernelSet& k) {
      SCOPED_TRACE(k.indexer_scores_batch.name);
      std::vector<float> got(ref.size(), -7.0f);
      k.indexer_scores_batch(iq.data(), w.data(), queries, heads, dim, cache.rows.data(), 5, n.data(), got.data(), ld);
      for (int q = 0; q < queries; ++q) {
        const size_t o = static_cast<size_t>(q) * ld;
        ExpectClose(std::vector<float>(got.begin() + o, got.begin() + o + ld),
                    std::vector<float>(ref.begin() + o, ref.begin() + o + ld), 1e-5);
        for (size_t s = static_cast<size_t>(n[static_cast<size_t>(q)]); s < ld; ++s)
          ASSERT_EQ(got[o + s], -7.0f) << "query " << q << " wrote past its keys at " << s;
      }
    });
  }
}

TEST(TopKKernel, MatchesStableSortWithTies) {
  std::mt19937 rng(3);
  for (int n : {1, 2, 17, 1000, 5000, 14000}) {
    std::vector<float> s(static_cast<size_t>(n));
    std::uniform_int_distribution<int> d(-10, 10);  // many exact ties, negatives, zeros
    std::normal_distribution<float> g(0.0f, 3.0f);
    for (size_t i = 0; i < s.size(); ++i) {
      // Thirds: small integers (ties), continuous values, and zeros of both signs.
      const size_t kind = i % 3;
      s[i] = kind == 0 ? static_cast<float>(d(rng)) : kind == 1 ? g(rng) : (d(rng) < 0 ? -0.0f : 0.0f);
    }
    for (int k : {1, 2, n / 3, n / 2 + 1, n - 1, n, 2048}) {
      if (k < 1 || k > n) continue;
      std::vector<int> idx(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] > s[b]; });
      std::vector<int> want(idx.begin(), idx.begin() + k);
      std::sort(want.begin(), want.end());
      std::vector<int> got(static_cast<size_t>(k));
      TopKIndices(s.data(), n, k, got.data());
      EXPECT_EQ(got, want) << "n " << n << " k " << k;
    }
  }
}

}  // namespace
}  // namespace moeserve::kernels

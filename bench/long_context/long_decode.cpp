// One decode step of the `long` preset (six Gated DeltaNet and two DSA
// layers at tiny's widths, model_config.cpp) after 4K ... 1M tokens of
// context: the whole model's step, weights, DeltaNet state, the indexer over
// every cached key, its top-2048 and the attention over them, as the engine
// runs it (Model::Forward with one token, the cache in a KvPool of the
// engine's 16-token blocks).
//
// The cache is not prefilled to 1M (that takes about an hour here:
// bench_long_prefill). The first --seed tokens are a real prefill, so the
// DeltaNet states and the first rows are the model's own; every later row
// is a copy of a real one with the DSA layers' indexer keys redrawn (the
// real key plus noise of a quarter of its spread, quantised again where the
// keys are int8), so the indexer's scores are as varied as real ones and
// the top-k sees no artificial ties. The rows' contents do not change what
// a step reads or computes, only which keys win.
//
// Printed per length: the step (best and median of --steps), the same
// steps with the profile on, split by layer kind and part, and the step /
// the step at the shortest length against the target (at most 3x at 1M);
// then the floor under that ratio in the same run: the longest length's
// indexer keys read once at the best read bandwidth, on top of the
// shortest length's step.
//
//   bench_long_decode [--lengths 4K,16K,64K,256K,1M] [--steps 16] [--seed 2048] [--model DIR]
//                     [--indexer-scores exact|int8] [--block-tokens 16]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "long_preset.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/read_bandwidth.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace me = moeserve::engine;
namespace mk = moeserve::kernels;

namespace {

int Usage() {
  std::fprintf(stderr, "usage: bench_long_decode [--lengths 4K,16K,64K,256K,1M] [--steps 16] [--seed 2048] [--model DIR] "
                       "[--indexer-scores exact|int8] [--block-tokens 16]\n");
  return 2;
}

// Fills positions [from, to) of the cache (from a multiple of the block
// size): each block a copy of real block (b % its count in the seed), then
// every DSA layer's indexer keys redrawn around the copied ones. The keys
// are the part after the layer's latent rows (attention_mla.cpp), each
// part's rows of a block stored together (KvPool::PartRow), int8 keys by
// block (indexer_int8.hpp).
void ExtendCache(const me::Model& model, me::KvPool& pool, const me::SequenceCache& cache, int64_t from, int64_t to,
                 int seed, std::mt19937& rng) {
  const me::ModelConfig& cfg = model.config();
  const int bt = pool.block_tokens(), dim = cfg.dsa.index_head_dim;
  const bool int8 = model.options().indexer_scores == me::IndexerScores::kInt8;
  const size_t latent = static_cast<size_t>(cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim);
  const size_t key_floats = int8 ? mk::IndexerInt8KeyFloats(dim) : static_cast<size_t>(dim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> key(static_cast<size_t>(dim)), row(key_floats);
  for (int64_t b = from / bt; b * bt < to; ++b) {
    const int dst = cache.blocks[static_cast<size_t>(b)], src = cache.blocks[static_cast<size_t>(b % (seed / bt))];
    pool.CopyBlock(dst, src);
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (cfg.layer_types[static_cast<size_t>(l)] != me::LayerKind::kDsa) continue;
      float* block = pool.PartRow(dst, 0, model.layer_cache_offset(l) + latent, key_floats);
      for (int slot = 0; slot < bt; ++slot) {
        float* k = block + static_cast<size_t>(slot) * key_floats;  // fp32: rows of the part
        if (int8) {
          mk::LoadIndexerKeyInt8Blocked(block, dim, bt, slot, row.data());
          mk::DequantizeIndexerKeyInt8(row.data(), dim, key.data());
        } else {
          std::memcpy(key.data(), k, key.size() * sizeof(float));
        }
        double spread = 0;
        for (float x : key) spread += static_cast<double>(x) * x;
        const float noise = 0.25f * static_cast<float>(std::sqrt(spread / dim));
        for (float& x : key) x += noise * nd(rng);
        if (int8) mk::StoreIndexerKeyInt8Blocked(key.data(), dim, block, bt, slot);
        else std::memcpy(k, key.data(), key.size() * sizeof(float));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {4096, 16384, 65536, 262144, 1 << 20};
  int steps = 16, seed = 2048;
  int block_tokens = 16;  // EngineOptions::block_tokens (the daemon's `block_tokens`)
  std::string model_path;
  me::ModelOptions mo;
  mo.indexer_scores = me::IndexerScores::kInt8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) return Usage();
    if (a == "--lengths") {
      if (!moeserve::bench::ParseLengths(v, lengths)) return 2;
    } else if (a == "--steps") {
      steps = std::atoi(v);
    } else if (a == "--seed") {
      seed = std::atoi(v);
    } else if (a == "--block-tokens") {
      block_tokens = std::atoi(v);
    } else if (a == "--model") {
      model_path = v;
    } else if (a == "--indexer-scores" && (std::string(v) == "exact" || std::string(v) == "int8")) {
      mo.indexer_scores = std::string(v) == "int8" ? me::IndexerScores::kInt8 : me::IndexerScores::kExact;
    } else {
      return Usage();
    }
    ++i;
  }
  std::sort(lengths.begin(), lengths.end());
  if (steps < 1 || block_tokens < 1 || block_tokens > 4096 || seed < block_tokens || seed % block_tokens != 0 ||
      lengths.front() <= seed) {
    std::fprintf(stderr, "--steps must be positive, --block-tokens 1 to 4096, --seed a multiple of the block tokens "
                         "shorter than the shortest length\n");
    return 2;
  }
  const moeserve::bench::LongModel long_model("bench_long_decode", model_path, mo);
  const me::Model* const model = long_model.get();
  if (model == nullptr) return 1;
  const me::ModelConfig& cfg = model->config();
  if (lengths.back() > cfg.max_position_embeddings) {
    std::fprintf(stderr, "--lengths: %lld tokens exceed max_position_embeddings %lld\n",
                 static_cast<long long>(lengths.back()), static_cast<long long>(cfg.max_position_embeddings));
    return 2;
  }
  const int64_t capacity = lengths.back();
  me::KvPool pool((capacity + block_tokens - 1) / block_tokens, block_tokens, model->cache_floats_per_token(),
                  model->cache_stripes());
  me::SequenceCache cache = model->NewSequence();
  if (auto st = me::EnsureBlocks(pool, cache, capacity); !st) {
    std::fprintf(stderr, "pool: %s\n", st.error().ToString().c_str());
    return 1;
  }
  std::mt19937 rng(7);
  std::vector<int> prompt(static_cast<size_t>(seed));
  for (int& t : prompt) t = static_cast<int>(rng() % static_cast<unsigned>(cfg.vocab_size));
  std::vector<float> logits;
  {
    me::ForwardSegment seg{&cache, prompt, false};
    if (auto st = model->Forward(pool, std::span(&seg, 1), &logits); !st) {
      std::fprintf(stderr, "prefill: %s\n", st.error().ToString().c_str());
      return 1;
    }
  }
  std::printf("bench_long_decode: %s, %d threads, %s indexer scores, %d-token pool blocks, a %d-token prefill then "
              "copied rows, %d steps a length\n",
              long_model.path().c_str(), mk::DefaultThreadPool().size(),
              mo.indexer_scores == me::IndexerScores::kInt8 ? "int8" : "exact (fp32)", block_tokens, seed, steps);
  std::printf("%9s %10s %10s %10s %10s %10s %10s %10s %9s\n", "context", "best ms", "median ms", "dsa ms", "(indexer",
              "attention)", "delta ms", "other ms", "x first");
  const me::ProfilePart kParts[] = {me::ProfilePart::kIndexer, me::ProfilePart::kAttention};
  double first = 0, last = 0;
  int64_t filled = seed;
  for (int64_t L : lengths) {
    ExtendCache(*model, pool, cache, filled, L, seed, rng);
    filled = (L + block_tokens - 1) / block_tokens * block_tokens;
    std::vector<double> times;
    int token = prompt.back();
    // One untimed step, then the timed ones. Each is the context's L-th
    // token: it starts at length L - 1 and attends over L rows, its own
    // last (the row it wrote is written again by the next); the DeltaNet
    // states carry on from step to step.
    for (int s = -1; s < steps; ++s) {
      cache.length = L - 1;
      me::ForwardSegment seg{&cache, std::span<const int>(&token, 1), false};
      const auto t0 = std::chrono::steady_clock::now();
      if (auto st = model->Forward(pool, std::span(&seg, 1), &logits); !st) {
        std::fprintf(stderr, "decode at %lld: %s\n", static_cast<long long>(L), st.error().ToString().c_str());
        return 1;
      }
      if (s >= 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    // The same steps with the profile on (it runs a layer's sequences one
    // after another and reads the clock between parts): for the split only.
    me::ForwardProfile profile;
    me::ForwardTrace trace;
    trace.record_dsa = false;
    trace.profile = &profile;
    for (int s = 0; s < steps; ++s) {
      cache.length = L - 1;
      me::ForwardSegment seg{&cache, std::span<const int>(&token, 1), false};
      if (auto st = model->Forward(pool, std::span(&seg, 1), &logits, &trace); !st) return 1;
    }
    const auto row_ms = [&](int r) {
      double t = 0;
      for (int i = 0; i < me::kProfileParts; ++i) t += profile.seconds[r][i];
      return t * 1e3 / steps;
    };
    const int dsa = static_cast<int>(me::LayerKind::kDsa), delta = static_cast<int>(me::LayerKind::kDelta);
    double all = 0;
    for (int r = 0; r < me::kProfileRows; ++r) all += row_ms(r);
    std::sort(times.begin(), times.end());
    const double best = times.front(), median = times[times.size() / 2];
    if (first == 0) first = median;
    last = median;
    std::printf("%9lld %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %9.2f\n", static_cast<long long>(L), best * 1e3,
                median * 1e3, row_ms(dsa), profile.seconds[dsa][static_cast<int>(kParts[0])] * 1e3 / steps,
                profile.seconds[dsa][static_cast<int>(kParts[1])] * 1e3 / steps, row_ms(delta),
                all - row_ms(dsa) - row_ms(delta), median / first);
    std::fflush(stdout);
  }
  std::printf("median step at %lld / at %lld tokens: %.2f (target at most 3 at 1M) %s\n",
              static_cast<long long>(lengths.back()), static_cast<long long>(lengths.front()), last / first,
              last / first <= 3 ? "ok" : "OVER");
  // The floor under that ratio, measured in the same run: a step at the
  // longest length reads every cached indexer key of every DSA layer at
  // least once, so it takes at least the shortest length's step plus those
  // bytes at the machine's best read bandwidth (the probe's fastest pass on
  // the same threads, over an array several times the last-level cache).
  int dsa_layers = 0;
  for (const me::LayerKind kind : cfg.layer_types) dsa_layers += kind == me::LayerKind::kDsa;
  const double key_bytes = static_cast<double>(lengths.back()) * dsa_layers * sizeof(float) *
                           static_cast<double>(mo.indexer_scores == me::IndexerScores::kInt8
                                                   ? mk::IndexerInt8KeyFloats(cfg.dsa.index_head_dim)
                                                   : static_cast<size_t>(cfg.dsa.index_head_dim));
  const size_t probe_mib = mk::ProbeArrayMiB();
  const mk::ReadBandwidth bw = mk::MeasureReadBandwidth(probe_mib, 1.0, 8);
  const double floor_s = key_bytes / bw.best_bytes_per_s;
  std::printf("floor: %.1f MB of indexer keys (%d DSA layers) at the best read pass %.1f GB/s (median %.1f; %zu MiB, "
              "%d threads) = %.3f ms; step at %lld at least %.3f ms, at least %.2f x the step at %lld\n",
              key_bytes / 1e6, dsa_layers, bw.best_bytes_per_s / 1e9, bw.median_bytes_per_s / 1e9, probe_mib,
              mk::DefaultThreadPool().size(), floor_s * 1e3, static_cast<long long>(lengths.back()),
              (first + floor_s) * 1e3, (first + floor_s) / first, static_cast<long long>(lengths.front()));
  me::ReleaseBlocks(pool, cache);
  return 0;
}

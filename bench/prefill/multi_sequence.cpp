// bench_prefill --sequences (multi_sequence.hpp).
#include "multi_sequence.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::bench {

namespace {

namespace me = moeserve::engine;

constexpr int kBlockTokens = 16;

// One layout's run: its time, the profile of all its passes, how many passes,
// and each prompt's last-row logits (sequences x vocab).
struct LayoutRun {
  double seconds = 0;
  me::ForwardProfile profile;
  int passes = 0;
  std::vector<float> last_logits;
};

class Prefiller {
 public:
  Prefiller(const me::FamilyModel& model, const MultiSequenceArgs& args, const std::vector<std::vector<int>>& prompts)
      : model_(model), args_(args), prompts_(prompts),
        pool_(args.sequences * ((args.tokens + kBlockTokens - 1) / kBlockTokens + 1) + 1, kBlockTokens,
              model.cache_floats_per_token(), model.cache_stripes()) {}

  // As the engine's Advance with nothing decoding: every pass gives the
  // prompts, in submission order, rows until `chunk` are taken.
  bool Together(LayoutRun& run) { return Run(run, true); }
  // Each prompt alone, in passes of up to `chunk` rows.
  bool OneByOne(LayoutRun& run) { return Run(run, false); }

 private:
  bool Run(LayoutRun& run, bool together) {
    const int N = args_.sequences, T = args_.tokens, V = args_.vocab;
    std::vector<me::SequenceCache> caches;
    for (int i = 0; i < N; ++i) caches.push_back(model_.NewSequence());
    run = LayoutRun{};
    run.last_logits.assign(static_cast<size_t>(N) * static_cast<size_t>(V), 0.0f);
    me::ForwardTrace trace;
    trace.record_dsa = false;
    trace.profile = &run.profile;
    std::vector<float> logits;
    std::vector<me::ForwardSegment> segments;
    std::vector<int> owners;
    const auto t0 = std::chrono::steady_clock::now();
    for (int alone = 0; alone < (together ? 1 : N); ++alone) {
      for (;;) {
        segments.clear();
        owners.clear();
        int budget = args_.chunk;
        for (int i = together ? 0 : alone; i < (together ? N : alone + 1) && budget > 0; ++i) {
          me::SequenceCache& c = caches[static_cast<size_t>(i)];
          const int start = static_cast<int>(c.length);
          const int n = std::min(T - start, budget);
          if (n <= 0) continue;
          budget -= n;
          if (auto st = me::EnsureBlocks(pool_, c, start + n); !st)
            return Error("blocks", st.error().ToString());
          segments.emplace_back(&c, std::span<const int>(prompts_[static_cast<size_t>(i)].data() + start, static_cast<size_t>(n)),
                                false);
          owners.push_back(i);
        }
        if (segments.empty()) break;
        if (auto st = model_.Forward(pool_, segments, &logits, &trace); !st) return Error("forward", st.error().ToString());
        ++run.passes;
        for (size_t k = 0; k < owners.size(); ++k)
          if (caches[static_cast<size_t>(owners[k])].length == T)
            std::copy_n(logits.begin() + static_cast<std::ptrdiff_t>(k * static_cast<size_t>(V)), V,
                        run.last_logits.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(owners[k]) * static_cast<size_t>(V)));
      }
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& c : caches) me::ReleaseBlocks(pool_, c);
    return true;
  }

  static bool Error(const char* what, const std::string& message) {
    std::fprintf(stderr, "bench_prefill: %s: %s\n", what, message.c_str());
    return false;
  }

  const me::FamilyModel& model_;
  const MultiSequenceArgs& args_;
  const std::vector<std::vector<int>>& prompts_;
  me::KvPool pool_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Largest |a - b| over the largest |b|, over every prompt's row.
double MaxRelativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

int RunMultiSequencePrefill(const engine::FamilyModel& model, const MultiSequenceArgs& args) {
  const int N = args.sequences, T = args.tokens;
  std::vector<std::vector<int>> prompts(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) {
    std::mt19937 rng(static_cast<unsigned>(7 + i));
    for (int p = 0; p < T; ++p) prompts[static_cast<size_t>(i)].push_back(static_cast<int>(rng() % static_cast<unsigned>(args.vocab)));
  }
  Prefiller prefiller(model, args, prompts);
  const bool bounded = args.ceilings.fma > 0 && args.ceilings.bw > 0;
  const double tokens = static_cast<double>(N) * T;
  std::printf("\nprefill of %d prompts of %d tokens, passes of at most %d rows: together (the engine's step: one "
              "segment per prompt) against one by one, %d alternating rounds\n",
              N, T, args.chunk, args.rounds);
  std::printf("%6s %14s %9s %14s %9s %7s\n", "round", "together tok/s", "of bound", "one by one", "of bound", "ratio");
  std::vector<double> together_rate, alone_rate, together_share, alone_share;
  LayoutRun together, alone;
  for (int r = 0; r < args.rounds; ++r) {
    // Alternate which layout runs first, so a busy moment of the shared
    // machine falls on both alike.
    const bool together_first = r % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool t = (k == 0) == together_first;
      if (!(t ? prefiller.Together(together) : prefiller.OneByOne(alone))) return 1;
    }
    together_rate.push_back(tokens / together.seconds);
    alone_rate.push_back(tokens / alone.seconds);
    if (bounded) {
      together_share.push_back(BoundSeconds(together.profile, args.ceilings, args.dot_products) / together.seconds);
      alone_share.push_back(BoundSeconds(alone.profile, args.ceilings, args.dot_products) / alone.seconds);
    }
    std::printf("%6d %14.1f %8.1f%% %14.1f %8.1f%% %6.2fx\n", r + 1, together_rate.back(),
                bounded ? 100.0 * together_share.back() : 0.0, alone_rate.back(), bounded ? 100.0 * alone_share.back() : 0.0,
                together_rate.back() / alone_rate.back());
  }
  const double tm = Median(together_rate), am = Median(alone_rate);
  std::printf("median: together %.1f tokens/s in %d passes", tm, together.passes);
  if (bounded) std::printf(" (%.1f%% of the bound of its work)", 100.0 * Median(together_share));
  std::printf(", one by one %.1f tokens/s in %d passes", am, alone.passes);
  if (bounded) std::printf(" (%.1f%%)", 100.0 * Median(alone_share));
  std::printf("; together / one by one = %.2fx\n", tm / am);
  // Where the time went, by part (the last round's runs): which part of the
  // forward pass gains or loses from the wider passes.
  const auto& kParts = me::kProfilePartNames;
  std::printf("last round by part, ms together / one by one:");
  for (int i = 0; i < me::kProfileParts; ++i) {
    double ts = 0, as = 0;
    for (int row = 0; row < me::kProfileRows; ++row) ts += together.profile.seconds[row][i], as += alone.profile.seconds[row][i];
    std::printf(" %s %.0f / %.0f%s", kParts[i], ts * 1e3, as * 1e3, i + 1 < me::kProfileParts ? ";" : "\n");
  }
  std::printf("last-row logits, together against one by one: max |diff| / max |logit| = %.2g\n",
              MaxRelativeDiff(together.last_logits, alone.last_logits));
  return 0;
}

}  // namespace moeserve::bench

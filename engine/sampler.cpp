#include "moeserve/engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

void MaskPadding(std::span<float> logits) {
  for (size_t i = tok::kFirstPadding; i < logits.size(); ++i) logits[i] = -std::numeric_limits<float>::infinity();
}

namespace {

// The argmax over finite logits, ties to the lower id; -1 when none is finite.
int Greedy(std::span<const float> logits) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(logits.size()); ++i)
    if (std::isfinite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  return best;
}

double UniformDraw(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }

// The tokens a sampled (temperature > 0) draw chooses among, each with its
// unnormalised weight exp((logit - max) / temperature), in the order a draw
// walks them, and their total: every finite id in id order without top-k or
// top-p; otherwise the top-k by logit (ties: lower id first), cut to the
// smallest prefix whose mass reaches top_p.
struct Support {
  std::vector<int> ids;
  std::vector<double> weights;
  double total = 0;
};

Support SamplingSupport(std::span<const float> logits, const SamplingParams& params, int best) {
  const int V = static_cast<int>(logits.size());
  const double mx = logits[best];
  const double temperature = params.temperature;
  auto weight = [&](int id) { return std::exp((logits[id] - mx) / temperature); };
  Support out;
  // Without top-k or top-p every finite id is a candidate and the order of
  // the walk does not change the distribution: walk the ids as they are, no
  // sort (a 200k-token vocabulary costs a sort of 200k ids otherwise).
  if (params.top_k <= 0 && params.top_p >= 1.0f) {
    for (int i = 0; i < V; ++i)
      if (std::isfinite(logits[i])) {
        out.ids.push_back(i);
        out.weights.push_back(weight(i));
        out.total += out.weights.back();
      }
    return out;
  }
  // Candidates by logit (ties: lower id first), cut by top-k. Only as many
  // as the nucleus needs are sorted: the leading `sorted` of them, grown by
  // 4x while the nucleus is not reached.
  std::vector<int> order;
  for (int i = 0; i < V; ++i)
    if (std::isfinite(logits[i])) order.push_back(i);
  const auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t candidates = order.size();
  if (params.top_k > 0 && candidates > static_cast<size_t>(params.top_k)) {
    candidates = static_cast<size_t>(params.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(candidates), order.end(), before);
    order.resize(candidates);
  }
  double sum = 0;
  for (int id : order) sum += weight(id);
  const double nucleus = params.top_p < 1.0f ? params.top_p * sum : sum;
  size_t sorted = std::min<size_t>(64, candidates), keep = 0;
  double kept_mass = 0;
  for (;;) {
    if (sorted < candidates)
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(sorted), order.end(), before);
    std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(sorted), before);
    // The smallest prefix whose mass reaches top_p (all of them without top_p).
    keep = 0;
    kept_mass = 0;
    while (keep < sorted && (keep == 0 || kept_mass < nucleus)) kept_mass += weight(order[keep++]);
    if (kept_mass >= nucleus || sorted == candidates) break;
    sorted = std::min(candidates, sorted * 4);
  }
  out.ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
  for (int id : out.ids) out.weights.push_back(weight(id));
  out.total = kept_mass;
  return out;
}

// The support's token at `target` of its cumulative weight (walked in its
// order), skipping `skip`; the last one walked when rounding leaves the
// target past the end.
int Walk(const Support& support, double target, int skip = -1) {
  double acc = 0;
  int last = -1;
  for (size_t i = 0; i < support.ids.size(); ++i) {
    if (support.ids[i] == skip) continue;
    acc += support.weights[i];
    last = support.ids[i];
    if (target < acc) return last;
  }
  return last;
}

}  // namespace

int SampleToken(std::span<float> logits, const SamplingParams& params, std::mt19937_64& rng) {
  const int best = Greedy(logits);
  if (best < 0) return -1;
  if (params.temperature <= 0.0f) return best;
  const Support support = SamplingSupport(logits, params, best);
  const double u = UniformDraw(rng);
  const int t = Walk(support, u * support.total);
  return t >= 0 ? t : best;
}

DraftVerdict VerifyDraftToken(std::span<float> logits, const SamplingParams& params, int draft, std::mt19937_64& rng) {
  const int best = Greedy(logits);
  if (best < 0) return {-1, false};
  if (params.temperature <= 0.0f) return {best, best == draft};
  const Support support = SamplingSupport(logits, params, best);
  double p_draft = 0;
  for (size_t i = 0; i < support.ids.size(); ++i)
    if (support.ids[i] == draft) p_draft = support.weights[i];
  // Accept with probability p(draft); the draft proposed it with certainty,
  // so min(1, p / q) is p.
  if (UniformDraw(rng) * support.total < p_draft) return {draft, true};
  // Rejected: draw from max(0, p - q), i.e. p without the draft, renormalised.
  const double rest = support.total - p_draft;
  if (rest <= 0) return {draft, true};  // rounding: the draft held all the mass
  const int t = Walk(support, UniformDraw(rng) * rest, draft);
  return {t >= 0 ? t : best, false};
}

TokenLogprobs::TokenLogprobs(std::span<const float> logits) : TokenLogprobs(logits, tok::kFirstPadding) {}

TokenLogprobs::TokenLogprobs(std::span<const float> logits, size_t ids)
    : logits_(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(std::min(logits.size(), ids))) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float l : logits_)
    if (std::isfinite(l)) mx = std::max<double>(mx, l);
  double sum = 0;
  for (float l : logits_)
    if (std::isfinite(l)) sum += std::exp(static_cast<double>(l) - mx);
  log_sum_ = mx + std::log(sum);
}

float TokenLogprobs::Of(int token) const {
  if (token < 0 || token >= static_cast<int>(logits_.size()) || !std::isfinite(logits_[token]))
    return -std::numeric_limits<float>::infinity();
  return static_cast<float>(static_cast<double>(logits_[token]) - log_sum_);
}

std::vector<TokenLogprob> TokenLogprobs::Top(int n) const {
  if (n <= 0) return {};  // the sampled token's value only: no pass over the vocabulary
  std::vector<int> ids(logits_.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(n, 0)), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int a, int b) {
    return logits_[a] > logits_[b] || (logits_[a] == logits_[b] && a < b);
  });
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < k; ++i) out.push_back({ids[i], Of(ids[i])});
  return out;
}

}  // namespace moeserve::engine

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

int SampleToken(std::span<float> logits, const SamplingParams& params, std::mt19937_64& rng) {
  const int V = static_cast<int>(logits.size());
  int best = -1;
  for (int i = 0; i < V; ++i)
    if (std::isfinite(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  if (best < 0) return -1;
  if (params.temperature <= 0.0f) return best;

  // Candidates sorted by logit (ties: lower id first), cut by top-k.
  std::vector<int> order;
  for (int i = 0; i < V; ++i)
    if (std::isfinite(logits[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (params.top_k > 0 && static_cast<int>(order.size()) > params.top_k) order.resize(static_cast<size_t>(params.top_k));

  std::vector<double> p(order.size());
  const double mx = logits[order[0]];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp((logits[order[i]] - mx) / params.temperature);
  for (auto& x : p) x /= sum;
  // Nucleus: the smallest prefix whose mass reaches top_p.
  if (params.top_p < 1.0f) {
    double acc = 0;
    size_t keep = p.size();
    for (size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (acc >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    p.resize(keep);
    order.resize(keep);
    double s = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& x : p) x /= s;
  }
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order.back();
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

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

}  // namespace moeserve::engine

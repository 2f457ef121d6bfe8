// Token sampling: greedy, temperature, top-k, top-p, from a per-sequence
// seeded generator (same seed and logits, same token, on every machine: the
// generator is std::mt19937_64 and the draw is a plain double in [0, 1)).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "moeserve/engine/engine.hpp"

namespace moeserve::engine {

// Sets padding ids (>= 268) to -inf: they are never sampled (model.md 8).
void MaskPadding(std::span<float> logits);

// Chooses a token from logits (modified in place). Greedy when temperature
// <= 0 (ties to the lower id). Returns -1 when every token is masked.
int SampleToken(std::span<float> logits, const SamplingParams& params, std::mt19937_64& rng);

// Speculative decoding's check of one draft token against the model's logits
// (modified in place, as SampleToken does). Greedy: the argmax, and the
// draft is accepted when it is that token. Sampled: the draft is accepted
// with probability p(draft) under the distribution SampleToken draws from
// (temperature, top-k, top-p); otherwise the token is drawn from that
// distribution without the draft, renormalised. A draft source that proposes
// one token with certainty (lookup, greedy MTP) has q = 1 at the draft, and
// this is the standard rule (accept with min(1, p/q), else draw from
// max(0, p - q)): the tokens it yields have exactly the distribution p.
// token -1: every token is masked.
struct DraftVerdict {
  int token = -1;
  bool accepted = false;
};
DraftVerdict VerifyDraftToken(std::span<float> logits, const SamplingParams& params, int draft, std::mt19937_64& rng);

// The log-softmax of raw logits over the tokenizer's ids (the padding rows
// past them excluded), before any temperature, top-p or mask: what
// `logprobs` reports. The engine uses it for every family.
class TokenLogprobs {
 public:
  // Reads the first `ids` logits (not modified; all of them when the row is
  // shorter); computed in double. gpt-oss passes its tokenizer's vocab_size().
  TokenLogprobs(std::span<const float> logits, size_t ids);
  // moe-dsa-v1's ids: those below tok::kFirstPadding.
  explicit TokenLogprobs(std::span<const float> logits);
  float Of(int token) const;
  // The `n` most likely tokens, most likely first (ties: lower id first).
  std::vector<TokenLogprob> Top(int n) const;

 private:
  std::vector<float> logits_;
  double log_sum_ = 0;  // log(sum(exp(logit)))
};

}  // namespace moeserve::engine

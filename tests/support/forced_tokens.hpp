// A decode controller that allows exactly one token sequence: every other id
// is masked. The tokens are then fixed whatever the model says, so runs with
// and without speculative drafts can be compared on a known output, and a
// draft copied from the prompt is accepted or refused by construction.
// Shared by the speculative decoding tests and bench_speculative.
#pragma once

#include <algorithm>
#include <limits>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "moeserve/engine/engine.hpp"

namespace moeserve::test_support {

class ForcedTokens : public engine::DecodeController {
 public:
  // Past the last token the last one stays allowed (max_tokens ends the run).
  explicit ForcedTokens(std::vector<int> tokens) : tokens_(std::move(tokens)) {
    if (tokens_.empty()) throw std::invalid_argument("ForcedTokens: no tokens to force");
  }
  void Mask(std::span<float> logits) override {
    const int allowed = tokens_[std::min(next_, tokens_.size() - 1)];
    for (size_t i = 0; i < logits.size(); ++i)
      if (static_cast<int>(i) != allowed) logits[i] = -std::numeric_limits<float>::infinity();
  }
  std::vector<int> OnToken(int) override {
    ++next_;
    return {};
  }

 private:
  std::vector<int> tokens_;
  size_t next_ = 0;
};

}  // namespace moeserve::test_support

// One gpt-oss sequence over a KvPool of its own, for tests that drive
// GptOssModel's forward pass without the engine (as a reference for it, or
// against the PyTorch reference).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/kv_pool.hpp"

namespace moeserve::engine {

class SoloSequence {
 public:
  explicit SoloSequence(const GptOssModel& model, int64_t max_tokens = 1024, int block_tokens = 16)
      : model_(&model),
        pool_(std::make_unique<KvPool>((max_tokens + block_tokens - 1) / block_tokens, block_tokens,
                                       model.cache_floats_per_token())),
        cache_(model.NewSequence()) {}

  // Appends `tokens`; logits for every token (all_logits) or the last.
  Status Forward(std::span<const int> tokens, bool all_logits, std::vector<float>* logits) {
    MOE_TRY(EnsureBlocks(*pool_, cache_, cache_.length + static_cast<int64_t>(tokens.size())));
    ForwardSegment seg{&cache_, tokens, all_logits};
    return model_->Forward(*pool_, std::span<ForwardSegment>(&seg, 1), logits);
  }
  int64_t length() const { return cache_.length; }

 private:
  const GptOssModel* model_;
  std::unique_ptr<KvPool> pool_;
  SequenceCache cache_;
};

}  // namespace moeserve::engine

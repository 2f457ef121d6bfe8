// The moe-dsa-v1 forward pass on CPU (model.md sections 3-6), reading top to
// bottom like the spec: embed, then per layer attention (MLA, DSA or Gated
// DeltaNet) and FFN (dense SwiGLU or MoE), then the head.
//
// Forward() runs a batch of segments: each segment is the next tokens of one
// sequence (a prefill chunk, or one decode token). Linear layers run over all
// tokens of the batch at once; attention runs per segment against that
// sequence's cache.
//
// Thread safety: a Model is immutable after Load(); Forward() may be called
// from one thread at a time per KvPool.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::kernels {
struct KernelSet;
}

namespace moeserve::engine {

// Which of two equal forms a layer uses (model.md 5.1, 5.3). kAuto: the
// chunked DeltaNet for multi-token segments (prefill), the recurrent one for
// one token (decode); the absorbed MLA for one token, and for every segment
// with the fast kernels (the expanded form is the reference kernels' prefill).
enum class MlaForm { kAuto, kExpanded, kAbsorbed };
enum class DeltaForm { kAuto, kRecurrent, kChunked };

struct ModelOptions {
  MlaForm mla_form = MlaForm::kAuto;
  DeltaForm delta_form = DeltaForm::kAuto;
  int delta_chunk = 64;  // chunk length of the WY form
  KernelChoice kernels = KernelChoice::kFast;
};

struct ForwardSegment {
  SequenceCache* cache = nullptr;
  std::span<const int> tokens;   // at positions cache->length ...
  bool all_logits = false;       // logits for every token, else only the last
};

// Optional observations of a forward pass, for tests and metrics.
struct ForwardTrace {
  // dsa_selected[layer][query index in the batch] = sorted selected positions
  std::map<int, std::vector<std::vector<int>>> dsa_selected;
};

struct ModelWeights;

class Model {
 public:
  static Result<std::unique_ptr<Model>> Load(const ModelDir& dir, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // Also chooses the kernels the model runs with (a KernelSet, see
  // moeserve/kernels/cpu_kernels.hpp).
  void set_options(const ModelOptions& o);
  // Floats one token occupies in a KvPool row (all attention layers).
  size_t cache_floats_per_token() const { return floats_per_token_; }
  // A cache with zeroed DeltaNet state and no blocks.
  SequenceCache NewSequence() const;

  // Appends each segment's tokens to its cache (blocks must already cover
  // them: EnsureBlocks) and writes logits rows (vocab_size floats each) in
  // segment order. expert_tokens, when given, is incremented per routed
  // (layer, expert).
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr, std::vector<std::vector<uint64_t>>* expert_tokens = nullptr) const;

 private:
  Model() = default;
  ModelConfig config_;
  ModelOptions options_;
  const kernels::KernelSet* kernels_ = nullptr;  // from options_.kernels
  bool absorbed_prefill_ = false;                // from options_.mla_form and the kernels
  std::unique_ptr<ModelWeights> weights_;
  size_t floats_per_token_ = 0;
  std::vector<size_t> layer_offset_;  // each attention layer's offset within a token row
  std::vector<float> rope_freqs_;     // qk_rope_head_dim / 2 YaRN frequencies
  float mla_scale_ = 0;
};

}  // namespace moeserve::engine

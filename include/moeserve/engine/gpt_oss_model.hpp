// The gpt-oss family on CPU, loaded from a Hugging Face checkpoint directory
// as published (config.json model_type "gpt_oss", safetensors shards listed by
// model.safetensors.index.json, MXFP4 experts as *_blocks / *_scales): no
// conversion step. docs/model-format.md ("gpt-oss") describes what is accepted.
//
// Weights stay as published: dense matrices BF16 (read in place from the
// mapped shards), experts MXFP4 (repacked once for the kernels, 4.25 bits a
// weight), so gpt-oss-20b needs about 13 GB. Products run through a KernelSet
// (cpu_kernels.hpp): the best this CPU supports, or the reference set.
//
// It serves on the one Engine (engine.hpp) as a family (family.hpp): its
// keys and values live in the engine's shared KvPool, so sequences batch
// together (one forward for every decode step and prefill chunk of a step)
// and share cached prompt blocks like every family. Banded (sliding-window)
// layers keep every position's keys in their blocks, as full layers do, and
// read only the window: a block is shared by full and banded layers alike,
// which a trimmed band could not be. The chat side (harmony: analysis is
// reasoning, a spent thinking budget opens the final message) is
// HarmonyChatHooks.
//
// Thread safety: immutable after Load(); Forward() from one thread at a time per KvPool.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/harmony.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::engine {

struct GptOssConfig {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int experts = 0, experts_per_token = 0, vocab = 0, sliding_window = 0;
  int max_position = 4096;  // max_position_embeddings: the context window
  float rms_eps = 1e-5f, swiglu_limit = 7.0f, swiglu_alpha = 1.702f;
  bool tie_embeddings = false;
  std::vector<bool> sliding;  // per layer: banded (sliding_window) or full attention
  std::vector<float> inv_freq;  // head_dim / 2 RoPE inverse frequencies (YaRN applied)
  float rope_concentration = 1.0f;  // YaRN attention factor, multiplies cos and sin
  std::vector<int> eos_tokens;
};

// Parses and validates config.json text; errors name the field.
Result<GptOssConfig> ParseGptOssConfig(const std::string& text);

class GptOssModel final : public FamilyModel {
 public:
  // bf16_activations: the products' activations rounded to BF16 from
  // kernels::kBf16ActMinRows rows on (KernelsWithBf16Activations: prefill
  // chunks; a decode step stays fp32), as ModelOptions::bf16_activations.
  static Result<std::unique_ptr<GptOssModel>> Load(const std::string& dir,
                                                   kernels::Isa isa = kernels::BestIsa(),
                                                   bool bf16_activations = false);
  ~GptOssModel() override;

  const GptOssConfig& config() const { return cfg_; }
  // Its sizes, layers and MXFP4 experts in ModelConfig's terms (family.hpp).
  ModelConfig Describe() const override;
  // The kernels its products run with (names say which variants).
  const kernels::KernelSet& kernels() const { return *kernels_; }
  // Bytes of weights held (dense as stored, experts packed), and those one
  // decoded token reads: every dense matrix, experts_per_token experts per
  // layer, the output head (the memory roofline's numerator).
  size_t weight_bytes() const;
  size_t active_weight_bytes_per_token() const;
  // The same split for a batched step (family.hpp): dense (every matrix,
  // norm and bias outside the experts, the head), one BF16 embedding row,
  // one expert of one layer (its MXFP4 matrices and biases).
  DecodeWeightBytes decode_weight_bytes() const override;

  int vocab_size() const override { return cfg_.vocab; }
  int64_t max_position() const override { return cfg_.max_position; }
  // Per layer: the token's keys, then its values (kv_heads * head_dim each).
  size_t cache_floats_per_token() const override;
  SequenceCache NewSequence() const override { return {}; }
  // The projections and experts run once over every segment's rows (each
  // weight read once for the batch: matrix-vector kernels for one row, GEMMs
  // for more); attention runs per (row, head) against the row's own
  // sequence's blocks.
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr,
                 std::vector<std::vector<uint64_t>>* expert_tokens = nullptr) const override;
  std::vector<int> ExpertCounts() const override;
  // 512: a 2,048-token prompt prefilled in one call ran no faster than in
  // 512-token blocks on the 4-layer 20b-shaped checkpoint (bench_prefill
  // --chunk, alternating runs: 9.7 and 12.6 tokens/s against 9.8 and 9.2, at
  // 23.5-25.8% of the same run's fp32 bound against 26.2-26.4%), and the
  // blocks keep each step's scratch a quarter the size.
  int idle_prefill_rows() const override { return 512; }

 private:
  struct Weights;
  GptOssModel() = default;
  GptOssConfig cfg_;
  const kernels::KernelSet* kernels_ = nullptr;
  std::unique_ptr<Weights> w_;
};

// The harmony chat format as the engine sees it. A token is reasoning when
// it is in the body of an `analysis` message (the prompt is read from its
// last <|start|>, so a prompt may end inside a message's header); the
// thinking budget ends an analysis message that reaches it by forcing
// `<|end|><|start|>assistant<|channel|>final<|message|>`. Stops: <|return|>,
// <|call|> and config.json's eos_token_id. Ids from the tokenizer's
// vocab_size on are the embedding's padding rows. A step whose controller
// masked every token fails the sequence.
class HarmonyChatHooks final : public ChatHooks {
 public:
  // Errors: the tokenizer lacks harmony's control tokens.
  static Result<std::shared_ptr<const HarmonyChatHooks>> Create(HfTokenizer tokenizer, const GptOssConfig& config);

  std::string family() const override { return "gpt-oss"; }
  std::vector<int> DefaultStops() const override { return stops_; }
  int sampled_ids() const override { return tokenizer_.vocab_size(); }
  std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest& request) const override;
  std::vector<int> CloseReasoning() const override { return close_analysis_; }
  std::optional<int> AllMaskedToken() const override { return std::nullopt; }

  const HfTokenizer* chat_tokenizer() const override { return &tokenizer_; }
  const HfTokenizer& tokenizer() const { return tokenizer_; }
  const HarmonyTokens& harmony_tokens() const { return harmony_; }

 private:
  explicit HarmonyChatHooks(HfTokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}
  HfTokenizer tokenizer_;
  HarmonyTokens harmony_;
  std::vector<int> stops_;
  std::vector<int> close_analysis_;
};

// The checkpoint without a chat format, for id-level runs (moe-run
// --prompt-ids): every id of the embedding may be sampled, nothing is
// reasoning, config.json's eos_token_id stops. It takes checkpoints whose
// vocabulary is cut below the tokenizer's (the tiny reference models).
std::shared_ptr<const ChatHooks> GptOssIdsOnlyChat(const GptOssConfig& config);

// DIR's gpt-oss model and harmony hooks (tokenizer.json with harmony's control tokens).
Result<FamilyParts> LoadGptOss(const std::string& dir, kernels::Isa isa = kernels::BestIsa(),
                               bool bf16_activations = false);

}  // namespace moeserve::engine

// The serving backend of the gpt-oss family: the StepEngine the daemon's
// scheduler drives, over GptOssModel (gpt_oss_model.hpp).
//
// Each sequence owns its attention cache (GptOssModel::State, banded layers
// trimmed to the sliding window). A step admits queued sequences while
// max_running and the token reservation allow (prompt + max_tokens of every
// running sequence within cache_tokens), runs up to prefill_chunk_tokens of
// prompt prefill, and decodes one token for every other running sequence.
// The decode steps of a step run as one batch (GptOssModel::ForwardBatch):
// the dense matrices and the experts are read once for all the sequences,
// attention runs per sequence. A sequence with several tokens since its last
// forward (forced tokens: a thinking-budget close, a call's end) runs them
// as a block of its own.
//
// Prompt-state cache: when a prompt's prefill ends, a copy of the sequence's
// attention cache is kept under its tokens; a later prompt that starts with
// (and is longer than) a kept prompt starts from that copy
// (usage.cached_tokens). An agent's tool loop re-sends the previous prompt
// plus the turn, so each turn prefills only what is new (harmony drops the
// reasoning after a final answer, so the prompt after one hits up to the
// start of that turn). Bounded by prefix_cache_bytes (the copies' floats and
// tokens), least recently used first out; a copy alone over the bound is not
// kept. A kept state is reused only by prompts of the same tenant
// (GenerationRequest::tenant), except the state after a public prefix
// (public_prefix_tokens), kept for every tenant. Waiting sequences are
// admitted round-robin across tenants (FairShareOrder). Results are the
// same with the cache on or off.
//
// Harmony-aware where the moe-dsa-v1 Engine is think-span-aware: a token is
// `reasoning` when it is in the body of an `analysis` message (counted in
// usage.reasoning_tokens), and the thinking budget ends an analysis message
// that reaches it by forcing `<|end|><|start|>assistant<|channel|>final<|message|>`.
// Stops: GenerationRequest::stop_tokens, or when empty <|return|>, <|call|>
// and config.json's eos_token_id; the stop token is emitted, then the finish.
// `logprobs` (GenerationRequest::logprobs, 0..20) as Engine reports them: on
// sampled tokens only, never forced ones (a controller's, the thinking
// budget's), the log-softmax of the raw logits over the tokenizer's ids
// (TokenLogprobs, sampler.hpp), before temperature, top-p and the
// controller's mask; -1 computes nothing.
//
// Thread safety: Submit, Cancel, Metrics and the accessors from any thread;
// Step from one thread at a time. Step never throws; a failed forward or a
// throwing controller fails only its sequence (kError).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/harmony.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::engine {

struct GptOssEngineOptions {
  int max_running = 64;
  int max_waiting = 256;
  int prefill_chunk_tokens = 512;
  int64_t cache_tokens = 1 << 16;  // prompt + max_tokens reserved by running sequences, together
  int max_context = 0;             // 0: max_position_embeddings
  // Bound on the prompt-state cache (below); 0 caches nothing.
  int64_t prefix_cache_bytes = int64_t{1} << 30;
};

class GptOssEngine : public StepEngine {
 public:
  // Loads DIR (config.json, safetensors, tokenizer.json with harmony's
  // control tokens). Errors name the file or field.
  static Result<std::unique_ptr<GptOssEngine>> Create(const std::string& dir, const GptOssEngineOptions& options);
  ~GptOssEngine() override;

  // Errors: kInvalidArgument (empty prompt, ids outside the vocabulary,
  // max_tokens < 1, logprobs outside -1..20), kOutOfRange (prompt + max_tokens past the context, or
  // past cache_tokens so it could never run), kResourceExhausted (queue full).
  Result<SequenceId> Submit(GenerationRequest request) override;
  void Cancel(SequenceId id) override;
  std::vector<TokenEvent> Step() override;
  bool HasWork() const override;

  // running, waiting, cache_usage_ratio (reserved / cache_tokens), the
  // prompt-state cache's lookups, hits, bytes, entries and evictions; the
  // expert figures stay empty.
  EngineMetrics Metrics() const;
  const GptOssConfig& config() const;
  const HfTokenizer& tokenizer() const;
  const HarmonyTokens& harmony_tokens() const;
  int max_context() const;

 private:
  struct Impl;
  explicit GptOssEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::engine

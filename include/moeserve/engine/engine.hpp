// The serving engine: continuous batching over one loaded model.
//
// Sequences are submitted from any thread; one thread (the scheduler loop)
// calls Step() repeatedly. Each step admits waiting sequences while the cache
// pool has room, runs up to `prefill_chunk_tokens` of prompt prefill (so a
// long prompt never stalls the running batch for more than one chunk), and
// decodes one token for every running sequence in a single batched forward
// pass. Finished and cancelled sequences leave the batch and free their cache
// blocks in the step that finishes them.
//
// Prefix caching: the prompt's longest prefix already held by the cache
// (whole blocks, plus the DeltaNet state snapshot taken at that block
// boundary) is reused; results are the same with it on or off (model.md
// section 10).
//
// Thread safety: Submit, Cancel, Metrics and the const accessors may be called
// from any thread; Step must be called from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::engine {

using SequenceId = uint64_t;

struct SamplingParams {
  float temperature = 1.0f;  // <= 0: greedy (argmax, ties to the lower id)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;         // each sequence has its own generator: same seed, same tokens
};

// Lets the caller steer decoding of one sequence: mask tokens that would
// leave a grammar, and force tokens the engine must emit without sampling
// (the server-assigned tool-call id after <|tool_call|>). Called only from the
// Step() thread.
class DecodeController {
 public:
  virtual ~DecodeController() = default;
  // Before sampling: set the logits of forbidden tokens to -infinity.
  virtual void Mask(std::span<float> logits) { (void)logits; }
  // After each emitted token (sampled or forced): tokens to emit next, in order.
  virtual std::vector<int> OnToken(int token) {
    (void)token;
    return {};
  }
};

struct GenerationRequest {
  std::vector<int> prompt;        // rendered chat, ending with <|assistant|><|think|> for a chat turn
  SamplingParams sampling;
  int max_tokens = 256;           // completion tokens, reasoning included
  int thinking_budget = -1;       // reasoning tokens before a forced <|/think|>; -1: no limit
  bool starts_in_reasoning = true;  // the prompt opened <|think|> (chat turns do)
  std::vector<int> stop_tokens;   // empty: <|end|> and <|eos|>
  std::shared_ptr<DecodeController> controller;  // optional
};

enum class FinishReason { kNone, kStop, kLength, kCancelled };

struct SequenceUsage {
  int prompt_tokens = 0;
  int cached_tokens = 0;      // prompt tokens served from the prefix cache
  int completion_tokens = 0;  // every emitted token, the closing stop token included
  int reasoning_tokens = 0;   // tokens strictly between <|think|> and <|/think|>
};

struct TokenEvent {
  SequenceId id = 0;
  int token = -1;           // -1 when the event only reports a finish (cancel)
  bool reasoning = false;   // inside the thinking span
  bool forced = false;      // emitted by the engine or the controller, not sampled
  FinishReason finish = FinishReason::kNone;
  SequenceUsage usage;      // filled on the finishing event
};

enum class KernelChoice { kFast, kReference };

struct EngineOptions {
  int max_running = 64;              // sequences decoded together
  int max_waiting = 256;             // queued before Submit answers kResourceExhausted
  int prefill_chunk_tokens = 512;    // prompt tokens per step across all sequences
  int64_t cache_tokens = 1 << 16;    // token slots in the shared KV pool
  int block_tokens = 16;             // tokens per cache block (prefix-cache granularity)
  bool prefix_cache = true;
  KernelChoice kernels = KernelChoice::kFast;
  int threads = 0;                   // kernel threads, 0: all cores (MOESERVE_CPU_THREADS wins; fixed at first use)
  int max_context = 0;               // 0: the model's max_position_embeddings
};

struct EngineMetrics {
  int running = 0;
  int waiting = 0;
  double cache_usage_ratio = 0;       // used blocks / all blocks
  uint64_t prefix_lookup_tokens = 0;  // prompt tokens looked up in the prefix cache
  uint64_t prefix_hit_tokens = 0;     // of which served from it
  // expert_tokens[layer][expert]: tokens routed (layers without MoE are empty)
  std::vector<std::vector<uint64_t>> expert_tokens;
};

class Model;  // the forward pass (model.hpp)

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const ModelDir& model, const EngineOptions& options);
  ~Engine();

  // Queues a sequence. Errors: kInvalidArgument (empty prompt, padding or
  // out-of-range ids, prompt + max_tokens past the context window: the
  // message says "context length"), kResourceExhausted (queue full).
  Result<SequenceId> Submit(GenerationRequest request);
  // Cancels a queued or running sequence; it finishes with kCancelled and
  // frees its cache at the next Step.
  void Cancel(SequenceId id);
  // One scheduler step; returns the tokens emitted and finishes reported.
  std::vector<TokenEvent> Step();
  bool HasWork() const;

  EngineMetrics Metrics() const;
  const ModelConfig& config() const;
  int max_context() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::engine

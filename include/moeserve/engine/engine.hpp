// The serving engine: continuous batching over one loaded model.
//
// Sequences are submitted from any thread; one thread (the scheduler loop)
// calls Step() repeatedly. Each step admits waiting sequences while the cache
// pool has room, runs up to `prefill_chunk_tokens` of prompt prefill (so a
// long prompt never stalls the running batch for more than one chunk; up to
// `prefill_chunk_tokens_idle` when no sequence is decoding), and
// decodes one token for every running sequence in a single batched forward
// pass. Finished and cancelled sequences leave the batch and free their cache
// blocks in the step that finishes them.
//
// Prefix caching: the prompt's longest prefix already held by the cache
// (whole blocks, plus the DeltaNet state snapshot taken at that block
// boundary) is reused; results are the same with it on or off (model.md
// section 10). The cache is bounded in bytes (`prefix_cache_bytes`): its KV
// blocks, its DeltaNet state copies (per entry, often far larger than the
// blocks) and its bookkeeping all count; least recently used entries go first.
// With `prefix_disk_dir`, evicted entries go to a tier on the node's disk and
// are read back by later prompts that share them, across restarts
// (docs/operations.md, "Prefix cache on disk").
//
// Images (GenerationRequest::images) are embedded by the vision tower on a
// thread of its own, queued when their sequence is admitted (only those the
// prefix cache did not cover). A sequence's prefill stops before the first
// image whose rows are not back yet and waits there; the other sequences
// keep running. When every sequence waits for the tower, Step sleeps until
// the tower answers or Submit, Cancel or PinPrefix is called, so a loop of
// `while (HasWork()) Step()` does not spin. A cancelled or finished
// sequence's queued images are never embedded; the destructor waits for the
// one embedding that may be running and runs no queued one.
//
// Errors during a step are values, never exceptions: a sequence that cannot
// go on (its decode controller threw, forced a token outside the vocabulary,
// or its forward pass failed) finishes with FinishReason::kError and the
// engine's message in TokenEvent::error; the others keep running. Only the
// sequences a failure touches are failed.
//
// Thread safety: Submit, Cancel, Metrics and the const accessors may be called
// from any thread; Step must be called from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "moeserve/engine/vision.hpp"

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
// Step() thread. A controller that throws, or forces a token outside the
// vocabulary, fails its own sequence (kError) and no other.
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

// Speculative decoding: where a sequence's draft tokens come from. kMtp: the
// model's multi-token-prediction layers; kLookup: the longest recent n-gram
// of the sequence found earlier in its own context proposes what followed it
// there; kAuto: lookup when it finds a match, else MTP when the model has it.
// Drafts never change a greedy sequence's tokens, nor a sampled sequence's
// distribution: each is verified by the model in one pass.
enum class SpeculativeMode { kOff, kMtp, kLookup, kAuto };
// "off", "mtp", "lookup", "auto" (settings and request fields); nullopt otherwise.
std::optional<SpeculativeMode> ParseSpeculativeMode(std::string_view name);
std::string_view SpeculativeModeName(SpeculativeMode mode);

struct GenerationRequest {
  std::vector<int> prompt;        // rendered chat, ending with <|assistant|><|think|> for a chat turn
  SamplingParams sampling;
  int max_tokens = 256;           // completion tokens, reasoning included
  int thinking_budget = -1;       // reasoning tokens before the family closes the span (<|/think|>); -1: no limit
  bool starts_in_reasoning = true;  // moe-dsa-v1: the prompt opened <|think|> (chat turns do)
  std::vector<int> stop_tokens;   // empty: the family's (moe-dsa-v1: <|end|> and <|eos|>)
  std::shared_ptr<DecodeController> controller;  // optional
  // Log-probabilities of sampled tokens: -1 off (nothing is computed); 0..20
  // the sampled token's and this many of the most likely tokens' (the
  // the distribution of the model's logits over the tokenizer's ids, padding
  // excluded, before temperature, top-p and the controller's mask; api.md).
  int logprobs = -1;
  // Who the sequence is for (the daemon's tenant). Waiting sequences are
  // admitted round-robin across tenants (FairShareOrder), and a cached
  // prompt prefix is reused only by sequences of the same tenant.
  std::string tenant;
  // The leading prompt tokens that are the deployment's public prefix (the
  // daemon's configured public system prompt, never a tenant's choice): their
  // state is cached for, and reused by, every tenant. 0: none.
  int64_t public_prefix_tokens = 0;
  // Images of the prompt, in prompt order (vision.hpp: each a span of
  // placeholder tokens in `prompt` and its pixels). Only for a model with a
  // vision tower.
  std::vector<ImageSpan> images;
  // Speculative decoding for this sequence; unset: EngineOptions::speculative.
  std::optional<SpeculativeMode> speculative;
};

// The order in which waiting sequences are admitted: round-robin across
// tenants, each tenant's in arrival order. Given the tenants of a queue in
// arrival order, returns the queue's indices in admission order: every
// tenant's first, in the order they first arrived, then every tenant's
// second, and so on. One tenant's many requests cannot hold back another's.
std::vector<size_t> FairShareOrder(const std::vector<std::string>& tenants);

struct TokenLogprob {
  int token = 0;
  float logprob = 0;
};

// kCancelled: Cancel() was called. kError: the engine failed the sequence
// (TokenEvent::error says why); its cache is freed like any other finish.
enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

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
  std::string error;        // with kError: what failed, for logs and the client
  bool unavailable = false; // with kError: a peer failed (the expert-parallel group), not this request; retrying may help
  // With GenerationRequest::logprobs >= 0, on sampled tokens (never forced
  // ones): the token's log-probability and the most likely tokens', most
  // likely first (ties: lower id first).
  std::optional<float> logprob;
  std::vector<TokenLogprob> top_logprobs;
};

// Which CPU kernels a model runs with, chosen once when it is loaded: kFast
// the best variants this CPU runs (kernels::BestIsa(), capped by
// MOESERVE_CPU_ISA), kReference the plain reference kernels.
enum class KernelChoice { kFast, kReference };
// How the DSA indexer scores its keys (ModelOptions::indexer_scores): fp32
// keys and products (kExact), or keys kept int8 in the pool and integer dot
// products (kInt8).
enum class IndexerScores { kExact, kInt8 };

struct EngineOptions {
  int max_running = 64;              // sequences decoded together
  int max_waiting = 256;             // queued before Submit answers kResourceExhausted
  int prefill_chunk_tokens = 512;    // prompt tokens per step across all sequences
  // Prompt tokens per step when no sequence in the batch is decoding: no
  // one waits on that step, and larger chunks run the products nearer their
  // peak (a 4.4K-token prompt prefilled about 15 % faster in 2048-token
  // chunks than in 512-token ones). Below prefill_chunk_tokens it is that.
  int prefill_chunk_tokens_idle = 2048;
  int64_t cache_tokens = 1 << 16;    // token slots in the shared KV pool
  int block_tokens = 16;             // tokens per cache block (prefix-cache granularity)
  bool prefix_cache = true;
  // Bound on what the prefix cache keeps alive: its KV blocks, DeltaNet state
  // copies and bookkeeping. 0 caches nothing.
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  // Share of prefix_cache_bytes that pinned prefixes (PinPrefix) may hold;
  // past it, and when the KV pool needs room, pins give way.
  double prefix_pin_share = 0.5;
  KernelChoice kernels = KernelChoice::kFast;
  bool bf16_activations = false;     // ModelOptions::bf16_activations (prefill GEMMs in BF16)
  std::optional<ExpertFormat> experts;  // ModelOptions::experts (MXFP4 requantisation at load)
  int decode_activation_bits = 21;   // ModelOptions::decode_activation_bits: 21, 16 or 8
  IndexerScores indexer_scores = IndexerScores::kExact;  // ModelOptions::indexer_scores (DSA models)
  // Batch-invariant decode (ModelOptions::deterministic): a sequence's
  // logits, and so its tokens, are the same bits whatever else is in the
  // batch, however its prompt was split into prefill chunks and whether its
  // prefix came from the prefix cache. Every product runs row by row on the
  // matrix-vector kernels (no GEMM), attention one query per call, DeltaNet
  // in its recurrent form: prefill is several times slower (docs/operations.md
  // has the figures). Overrides bf16_activations. Not with ep_world > 1 (the
  // expert-parallel layers are not covered).
  bool deterministic = false;
  int threads = 0;                   // kernel threads, 0: all cores (MOESERVE_CPU_THREADS wins; fixed at first use)
  int max_context = 0;               // 0: the model's max_position_embeddings
  // cache_tokens = 0 sizes the pool from this many bytes instead: the pool
  // takes what is left after max_running sequences' recurrent state
  // (context_bytes.hpp, PoolTokensFor). The daemon passes a share of the
  // machine's free memory when its config leaves cache_tokens unset.
  int64_t cache_memory_bytes = 0;
  // The prefix cache's tier on the node's disk (prefix_disk_tier.hpp): a
  // directory for entries evicted from memory, read back by later prompts
  // and kept across restarts; empty: off. Bounded by prefix_disk_bytes,
  // and by age: files unused for longer than prefix_disk_max_age_seconds
  // are deleted (0: no bound by age).
  std::string prefix_disk_dir;
  int64_t prefix_disk_bytes = int64_t{16} << 30;
  double prefix_disk_max_age_seconds = 0;
  // Expert parallelism led by this engine (rank 0) or followed (ranks > 0):
  // the slice of experts to load; connect the group with model().SetGroup.
  // The prefix cache is off then: followers hold no copy of its snapshots.
  int ep_rank = 0, ep_world = 1;
  // Speculative decoding (SpeculativeMode): the default of requests that
  // name none. kMtp and kAuto load the model's MTP layers where it has them.
  SpeculativeMode speculative = SpeculativeMode::kOff;
  int draft_tokens = 3;            // tokens one draft proposes at most, 1-4
  // A step with more decoding sequences than this runs no draft: the batch
  // alone keeps the products busy, and verifying drafts would cost compute
  // (bench_speculative, `small` preset, every draft right: 2.1x at one
  // sequence, 0.64x at 8).
  int speculative_max_batch = 2;
};

// The model options an engine with these options loads its model with (the
// kernels, activations and expert-parallel slice): an expert-parallel
// follower loads its model with the same ones as rank 0's engine.
struct ModelOptions;
ModelOptions ModelOptionsFor(const EngineOptions& options);

struct PrefixCacheStats {
  int64_t bytes = 0;        // kv_bytes + state_bytes: what the cache keeps alive
  int64_t kv_bytes = 0;     // KV pool blocks the cache holds references on, each counted once
  int64_t state_bytes = 0;  // heap: DeltaNet state copies, token and block lists, bookkeeping
  int64_t limit_bytes = 0;
  int64_t entries = 0;
  // Entries dropped, by why: over the byte bound, over the entry cap, or to
  // make room in the KV pool for a new sequence.
  uint64_t evicted_for_bytes = 0;
  uint64_t evicted_for_entries = 0;
  uint64_t evicted_for_pool = 0;
  uint64_t too_large = 0;   // snapshots not cached because one alone exceeds the bound
  int64_t pinned_entries = 0;  // entries a live pin covers (Engine::PinPrefix)
  int64_t pinned_bytes = 0;    // their KV blocks and heap, each entry's blocks counted in full
  // The tier on disk (EngineOptions::prefix_disk_dir; all zero when off).
  int64_t disk_bytes = 0;          // the tier's files
  int64_t disk_limit_bytes = 0;    // prefix_disk_bytes
  int64_t disk_entries = 0;
  uint64_t disk_writes = 0;        // entries written: evicted from memory, or kept at shutdown
  uint64_t disk_write_bytes = 0;
  uint64_t disk_write_failures = 0;  // writes that failed (disk full, permissions); logged
  uint64_t disk_hits = 0;          // prompts whose prefix was read back from disk
  uint64_t disk_hit_tokens = 0;    // tokens read back
  uint64_t disk_read_bytes = 0;
  uint64_t disk_refused = 0;       // files refused and deleted: corrupt, truncated, another model's or partition's
  uint64_t disk_evictions = 0;     // files removed to stay within prefix_disk_bytes
  uint64_t disk_expired = 0;       // files removed as unused for longer than prefix_disk_max_age_seconds
};

// Draft tokens of one kind (SpeculativeMode), cumulative.
struct DraftCounts {
  uint64_t proposed = 0;  // tokens drafts proposed and the model verified
  uint64_t accepted = 0;  // of which the model's own choice agreed with
  uint64_t drafts = 0;    // drafts verified
};

struct EngineMetrics {
  int running = 0;
  int waiting = 0;
  double cache_usage_ratio = 0;       // used blocks / all blocks
  uint64_t prefix_lookup_tokens = 0;  // prompt tokens looked up in the prefix cache
  uint64_t prefix_hit_tokens = 0;     // of which served from it
  PrefixCacheStats prefix_cache;
  // expert_tokens[layer][expert]: tokens routed (layers without MoE are empty)
  std::vector<std::vector<uint64_t>> expert_tokens;
  DraftCounts drafts_mtp, drafts_lookup;
};

class Model;  // the forward pass (model.hpp)

// What a scheduler loop drives. Engine implements it; a loop that takes this
// interface can be handed a wrapped engine (tracing, or faults in tests)
// without knowing it.
class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual Result<SequenceId> Submit(GenerationRequest request) = 0;
  virtual void Cancel(SequenceId id) = 0;
  virtual std::vector<TokenEvent> Step() = 0;
  virtual bool HasWork() const = 0;
  // Housekeeping an idle engine does between requests (the prefix cache's
  // disk tier deleting files past their max age, which otherwise happens only
  // when a prompt next touches the tier). Called by the thread that calls
  // Step, while HasWork() is false; cheap when nothing is due.
  virtual void MaintainIdle() {}
};

class Engine : public StepEngine {
 public:
  // The engine over any family's model (family.hpp).
  static Result<std::unique_ptr<Engine>> Create(FamilyParts family, const EngineOptions& options);
  // The family that the registry (family_registry.hpp) finds for DIR, loaded.
  static Result<std::unique_ptr<Engine>> Open(const std::string& dir, const EngineOptions& options);
  // A moe-dsa-v1 directory already opened (OpenModelDir).
  static Result<std::unique_ptr<Engine>> Create(const ModelDir& model, const EngineOptions& options);
  ~Engine();

  // Queues a sequence. Errors: kInvalidArgument (empty prompt, padding or
  // out-of-vocabulary ids), kOutOfRange (prompt + max_tokens past the
  // context window: the model's positions, max_context, or what the KV pool
  // holds even when empty, the message then naming the bytes the request
  // needs, the pool's size and cache_tokens), kResourceExhausted (queue full).
  Result<SequenceId> Submit(GenerationRequest request) override;
  // Cancels a queued or running sequence; it finishes with kCancelled and
  // frees its cache at the next Step.
  void Cancel(SequenceId id) override;
  // One scheduler step; returns the tokens emitted and finishes reported.
  // Does not throw: failures become kError events (see the top of this file).
  // Sleeps when every sequence waits for the vision tower (see the top).
  std::vector<TokenEvent> Step() override;
  bool HasWork() const override;
  void MaintainIdle() override;

  EngineMetrics Metrics() const;
  // Keeps the cached prefixes of `tokens` (entries whose tokens begin it)
  // from eviction for `seconds` from now, under `key` (one pin per key; a new
  // call replaces it; seconds <= 0 removes it). Unpinned entries are evicted
  // first; pinned ones only past EngineOptions::prefix_pin_share of the
  // cache's bound, or when the KV pool needs their blocks for a new
  // sequence, so pins never starve new requests. Any thread; takes effect
  // at the next Step.
  void PinPrefix(uint64_t key, std::vector<int> tokens, double seconds);
  // The model described in the layer graph's terms, for every family
  // (FamilyModel::Describe: a family with its own forward pass fills what
  // applies; vision is set only where the model has a tower).
  const ModelConfig& config() const;
  // The shared layer graph, for the expert-parallel group's thread-safe
  // calls: null for a family with its own forward pass (gpt-oss), which
  // Create refuses to split across a group.
  const Model* model() const;
  // The family's forward pass and chat hooks.
  const FamilyModel& family_model() const;
  const ChatHooks& chat() const;
  int max_context() const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  static Status ValidateEngineOptions(const EngineOptions& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::engine

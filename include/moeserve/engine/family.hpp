// What a model family supplies to the one serving engine (engine.hpp).
//
// The engine is written once: admission, the shared KV pool and its block
// prefix cache, continuous batching, chunked prefill, sampling, logprobs,
// decode controllers, fair share. A family brings the two parts that differ
// between checkpoints:
//
//  * FamilyModel: the forward pass. It reads and writes the engine's KvPool
//    through each sequence's block table (SequenceCache), for a batch of
//    segments (prefill chunks and one-token decode steps of many sequences
//    in one call). Its config parser and weight loader run in its Load.
//  * ChatHooks: how the family's chat format shows in the token stream: the
//    default stop tokens, which emitted tokens are reasoning, and the tokens
//    that close a reasoning span when the thinking budget is spent.
//
// A family is one folder under engine/families/ and one line in the registry
// (engine/families/registry.cpp, read through family_registry.hpp), which
// maps a model directory to its family.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

struct GenerationRequest;
struct ForwardTrace;
class HfTokenizer;

// The next tokens of one sequence, appended at positions cache->length ...
// An input row given instead of embed[token] (an image token's tower output,
// model-format 14.5): token `index` of the segment takes `values` (hidden
// size floats, alive for the call).
struct RowEmbedding {
  int index = 0;
  const float* values = nullptr;
};

struct ForwardSegment {
  ForwardSegment() = default;
  ForwardSegment(SequenceCache* c, std::span<const int> t, bool all, std::span<const RowEmbedding> e = {})
      : cache(c), tokens(t), all_logits(all), embeddings(e) {}
  SequenceCache* cache = nullptr;
  std::span<const int> tokens;
  bool all_logits = false;  // logits for every token, else only the last
  std::span<const RowEmbedding> embeddings;  // ascending indices; only for a family with a vision tower
  // Verification of a speculative draft: when set, the recurrent state
  // after each of the segment's tokens is written here, [token][layer]
  // (attention layers' entries empty), so that the engine can roll the
  // cache back to any of them when the draft is cut short; the recurrent
  // layers then run their recurrent form, token by token, as decode does.
  // Families without recurrent state leave it untouched (their rollback is
  // the cache length alone).
  std::vector<std::vector<DeltaLayerState>>* state_trail = nullptr;
};

// One sequence's multi-token-prediction draft (FamilyModel::ProposeDrafts).
// The cache holds every token of the sequence but `next_token` (the one just
// sampled); the model proposes up to `max_tokens` tokens that follow it.
struct DraftSlot {
  SequenceCache* cache = nullptr;
  int next_token = 0;
  int max_tokens = 0;
  std::vector<int>* out = nullptr;  // appended to: the proposed tokens, in order
  // Ids from here on are never proposed: the family's padding rows
  // (ChatHooks::sampled_ids(), which the engine's sampling masks too).
  // 0: every id below vocab_size().
  int sampled_ids = 0;
};

// What one decode step reads of the weights as the model holds them in
// memory (BF16 matrices as BF16, fp32 ones and vectors as fp32, routed
// experts packed): the memory roofline's numerator (bench_batch_curve,
// moe-run). A step of B sequences reads `dense` once, B embedding rows, and
// each routed expert its tokens reached once; recurrent state and cached
// rows are not weights and are not counted here. `*_weights` count the
// matrix elements a token multiplies (2 FLOPs each), for a compute bound
// where the family has no ForwardProfile.
struct DecodeWeightBytes {
  double dense = 0;      // every tensor outside the routed experts and the embedding: attention,
                         // dense FFNs, shared experts, routers, norms, biases, the LM head
  double embed_row = 0;  // one row of the embedding, per sequence
  double expert = 0;     // one routed expert of one MoE layer (all its tensors), mean over the MoE layers
  int moe_layers = 0;
  int experts_per_token = 0;  // routed experts a token reaches per MoE layer
  double dense_weights = 0;   // matrix elements of `dense` that a token's products multiply
  double expert_weights = 0;  // the same for one routed expert
  // Bytes one decoded token reads alone (batch 1).
  double PerToken() const { return dense + embed_row + static_cast<double>(moe_layers) * experts_per_token * expert; }
};

// The forward pass the engine drives. Immutable after loading; Forward is
// called from one thread at a time per KvPool.
class FamilyModel {
 public:
  virtual ~FamilyModel() = default;
  // Rows of logits (the embedding's rows, padding included).
  virtual int vocab_size() const = 0;
  // The context window the checkpoint was trained for.
  virtual int64_t max_position() const = 0;
  // Floats one token occupies in a KvPool row, every layer together.
  virtual size_t cache_floats_per_token() const = 0;
  // The KvPool stripes the family's parts want (KvPool::PartRow); none: the
  // pool is one stripe, as TokenRow needs.
  virtual std::vector<size_t> cache_stripes() const { return {}; }
  // A cache with no blocks (and zeroed recurrent state where the family has any).
  virtual SequenceCache NewSequence() const = 0;
  // Appends each segment's tokens to its cache (its blocks must already
  // cover them: EnsureBlocks) and writes logits rows (vocab_size() floats
  // each) in segment order. expert_tokens, when given, is sized by
  // ExpertCounts() and incremented per routed (layer, expert).
  virtual Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                         ForwardTrace* trace = nullptr,
                         std::vector<std::vector<uint64_t>>* expert_tokens = nullptr) const = 0;
  // Experts per layer (0 for a layer without MoE): the shape of the engine's
  // expert_tokens metric.
  virtual std::vector<int> ExpertCounts() const = 0;
  // The decode step's weight bytes (DecodeWeightBytes); all zero where the
  // family does not say.
  virtual DecodeWeightBytes decode_weight_bytes() const { return {}; }
  // Prompt rows the engine prefills in one step when nothing decodes at most
  // (0: EngineOptions::prefill_chunk_tokens_idle decides alone; never below
  // prefill_chunk_tokens). A family whose larger calls are no faster caps it.
  virtual int idle_prefill_rows() const { return 0; }
  // The sequence ended (expert-parallel followers drop their copy).
  virtual void Retire(const SequenceCache& cache) const { (void)cache; }
  // Multi-token prediction (the checkpoint's MTP layers, loaded when
  // ModelOptions::mtp asks): the most tokens one ProposeDrafts call chains;
  // 0 when the model has none loaded.
  virtual int draft_depth() const { return 0; }
  // Proposes each slot's draft (greedy through the MTP layers). A draft only
  // ever costs acceptance, never correctness: the engine verifies every
  // proposed token with the model itself. The slots' caches must have blocks
  // for cache->length + max_tokens + 1 tokens.
  virtual Status ProposeDrafts(KvPool& pool, std::span<DraftSlot> slots) const {
    (void)pool;
    (void)slots;
    return Fail(Error::InvalidArgument("this model has no multi-token-prediction layers loaded"));
  }
  // The vision tower's config when the model has one (model-format 14), else null.
  virtual const VisionConfig* vision() const { return nullptr; }
  // The model described in the shared layer graph's terms (Engine::config()):
  // for a model on the graph its own config; a family with its own forward
  // pass fills what applies (sizes, layers, experts, context, expert format)
  // and leaves the rest at ModelConfig's defaults. This default says what
  // the interface above knows: vocabulary, context, layers and which route
  // to how many experts.
  virtual ModelConfig Describe() const {
    ModelConfig c;
    c.vocab_size = vocab_size();
    c.max_position_embeddings = max_position();
    const std::vector<int> experts = ExpertCounts();
    c.num_layers = static_cast<int>(experts.size());
    for (int e : experts) {
      c.moe_layers.push_back(e > 0);
      c.moe.num_experts = std::max(c.moe.num_experts, e);
    }
    return c;
  }
  // The tower's rows for one image, [ImageTokenCount, hidden size]: what
  // replaces its placeholders' embeddings (ForwardSegment::embeddings).
  virtual Result<std::vector<float>> EmbedImage(const ImageInput& image) const {
    (void)image;
    return Fail(Error::InvalidArgument("this model has no vision tower: image input is refused"));
  }
};

// One sequence's view of the chat format: which emitted tokens are reasoning.
class ReasoningTracker {
 public:
  virtual ~ReasoningTracker() = default;
  // Whether the next sampled token would be reasoning (the thinking budget
  // counts these).
  virtual bool InReasoning() const = 0;
  // Reads one emitted token; returns whether it is a reasoning token.
  // `is_stop`: it is one of the request's stop tokens.
  virtual bool Feed(int token, bool is_stop) = 0;
};

class ChatHooks {
 public:
  virtual ~ChatHooks() = default;
  // The family's name in the registry ("moe-dsa-v1", "gpt-oss"): what the
  // daemon keys its chat rendering by.
  virtual std::string family() const = 0;
  // Stop tokens of a request that names none.
  virtual std::vector<int> DefaultStops() const = 0;
  // Ids below this may be sampled and take part in logprobs; the ones from
  // here to vocab_size() are padding rows: never sampled, refused in prompts.
  virtual int sampled_ids() const = 0;
  // The tracker of a new sequence, given its request (and prompt).
  virtual std::unique_ptr<ReasoningTracker> NewTracker(const GenerationRequest& request) const = 0;
  // Forced when a sequence in reasoning has spent its thinking budget.
  virtual std::vector<int> CloseReasoning() const = 0;
  // What a sequence emits when its controller masked every token: a token
  // that ends the turn, or none (the sequence fails).
  virtual std::optional<int> AllMaskedToken() const = 0;
  // The tokenizer the family's chat is written in, where the hooks hold one
  // (a chat dialect renders and reads with it); null otherwise.
  virtual const HfTokenizer* chat_tokenizer() const { return nullptr; }
};

// A loaded family: what Engine::Create takes.
struct FamilyParts {
  std::unique_ptr<FamilyModel> model;
  std::shared_ptr<const ChatHooks> chat;
};

}  // namespace moeserve::engine

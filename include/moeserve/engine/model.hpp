// The shared layer graph: the moe-dsa-v1 forward pass on CPU (model.md
// sections 3-6), reading top to bottom like the spec: embed, then per layer
// attention (MLA, DSA, Gated DeltaNet, or the gated GQA other families map
// onto it) and FFN (dense SwiGLU or MoE), then the head.
//
// Forward() runs a batch of segments: each segment is the next tokens of one
// sequence (a prefill chunk, or one decode token). Linear layers run over all
// tokens of the batch at once; attention runs per segment against that
// sequence's cache.
//
// Thread safety: a Model is immutable after Load(); Forward() may be called
// from one thread at a time per KvPool.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/family.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_dir.hpp"

namespace moeserve::kernels {
struct KernelSet;
namespace comm {
class Communicator;
}
}  // namespace moeserve::kernels

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
  int delta_chunk = 32;  // chunk length of the WY form (of 16-64, 32 ran fastest on AVX-512)
  KernelChoice kernels = KernelChoice::kFast;
  // With the fast kernels: the products of kernels::kBf16ActMinRows (32) or
  // more rows with MXFP4 or BF16 weights (prefill) take BF16-rounded
  // activations (kernels/bf16_activations.hpp: vdpbf16ps where the CPU has
  // avx512_bf16), about twice the fp32 GEMMs' speed; on such CPUs latent
  // attention's blocks of prefill queries and DSA's sparse rows likewise
  // take BF16 dot products (queries, cached rows and softmax weights rounded
  // to BF16; the indexer's scores stay fp32 products, though of inputs
  // the BF16-activation projections made). Off by default: the rounding
  // (2^-8 of each activation) is a BF16 path in the sense of
  // docs/model-format.md section 10, outside the fp32 path's 1e-3 bound on
  // the random test models (measured up to 0.6 of max|logit| at late
  // positions of a 300-token prefill; 6e-3 at the first). The reference
  // kernels stay fp32 whatever this says.
  bool bf16_activations = false;
  // Bits per activation element in the MXFP4 products with the fast
  // kernels: 21 (the default: three int8 parts in decode, fp32 products from
  // kMxfp4GemmMinRows rows on), 16 (two) or 8 (one), these as integer
  // products at every row count (kernels::KernelsWithDecodeActivationBits).
  // Fewer bits mean fewer integer dot products per byte of weights; the
  // rounding, 0.5 / qmax of each block of 32's largest activation, is outside
  // some of docs/model-format.md section 10's bounds (that section says
  // which), so 21 stays the default. Deterministic decode and the reference
  // kernels keep the default whatever this says.
  int decode_activation_bits = 21;
  // Batch-invariant forward (EngineOptions::deterministic): a token's
  // results do not depend on the other tokens of the pass, bit for bit: the
  // products run row by row (kernels::KernelsBatchInvariant), attention one
  // query per call, the DSA indexer one query per pass, DeltaNet in its
  // recurrent form. Overrides bf16_activations and the forms above (MLA:
  // absorbed unless kExpanded; DeltaNet: recurrent).
  bool deterministic = false;
  // The DSA indexer scores a block of sparse rows over the cached keys in
  // tiles of this many keys, keeping each row's running top-k between tiles
  // (the same selection bit for bit: ties go to the lower position either
  // way), so its scratch is rows x (index_topk + tile) floats whatever the
  // context: 17 MB for a block of 64 rows, where one pass over a 1M-token
  // context held 256 MB. Contexts up to one tile take the single pass.
  int indexer_tile_keys = 65536;
  // The DSA indexer's score per key. kExact: fp32 keys in the cache, fp32
  // dot products (every exactness bound of docs/model-format.md section 10
  // is stated for it). kInt8: each indexer key is quantised once, when the
  // cache row is written (symmetric int8, one fp32 scale per key:
  // kernels/indexer_int8.hpp), and kept so in the pool, a quarter of its
  // fp32 bytes (33 floats for 128 dims, context_bytes.hpp); each query is
  // quantised per head, and the scores are integer dot products (vpdpbusd
  // on AVX-512 VNNI). Only the selection of keys changes: attention over
  // the selected keys stays as it was. Fixed at Load (the pool's row layout
  // follows it): set_options keeps the loaded model's choice. Needs
  // index_head_dim a multiple of 4; the reference kernels run the int8
  // reference. Off by default: the selection differs from the exact path's
  // where scores lie within the rounding of each other (measured in
  // tests/engine/indexer_int8_test.cpp).
  IndexerScores indexer_scores = IndexerScores::kExact;
  // The routed experts' format in memory. Unset: as the checkpoint stores
  // them. kMxfp4 for a family that converts or maps its published
  // checkpoint at load (deepseek_v32, qwen3_next), and for a moe-dsa-v1
  // checkpoint with BF16 experts loaded through the family registry,
  // requantises the routed experts from their BF16 values with model.md
  // section 7's encoder (dense layers, shared experts, attention and the
  // indexer stay BF16). A format other than the checkpoint's is refused
  // for every other family, and by Model::Load itself.
  std::optional<ExpertFormat> experts;
  // Load the checkpoint's multi-token-prediction layers (draft proposals for
  // speculative decoding, FamilyModel::ProposeDrafts). Off: they are skipped
  // and cost neither memory nor time.
  bool mtp = false;
  // Expert parallelism: this rank loads only its experts and every MoE layer
  // runs across the group (moe_parallel.cpp). Every rank must then call
  // Forward with the same segments, in the same order. Not owned; must
  // outlive the model. Null: one process holds every expert.
  kernels::comm::Communicator* comm = nullptr;
  // Without comm: the expert slice to load for a group connected later
  // (SetGroup).
  int ep_rank = 0, ep_world = 1;
};

// What the expert-parallel MoE layers did on this rank, cumulative.
struct ExpertParallelStats {
  uint64_t layers = 0;             // MoE layer passes run across the group
  uint64_t computed_rows = 0;      // (token, expert) rows this rank's experts computed
  std::vector<uint64_t> rank_rows; // [world]: rows routed to each rank's experts (every token of every batch)
};

// Where a forward pass spends its time, by layer kind and part (the prefill
// breakdown benchmark, bench/prefill). Filled only when ForwardTrace::profile
// points at one; with none, the timers are a null test each.
//   projections: the attention layers' dense products (q, kv, o, gates, the
//     indexer's q/k and weights, DeltaNet's in/out projections), a MoE
//     layer's router when it has no shared expert, and the LM head (model row);
//   experts: the routed experts' products;
//   attention: MLA / DSA attention over the cache (absorbed or expanded form),
//     gated GQA's scores and weighted sums;
//   indexer: the DSA indexer's scores and top-k;
//   delta_rule: DeltaNet's conv, norms, gates and chunked/recurrent rule;
//   glue: norms, RoPE, cache writes, routing, gathers, residual adds;
//   shared_experts: a MoE layer's shared experts and its router (one pass);
//   dense_ffn: a dense layer's SwiGLU FFN.
// flops is the logical work of each part (2 M N K for a product, the
// attention form that ran), not what a kernel executes (padding, the WY
// form's extra products); bytes, for glue only, the hidden-state bytes its
// norms and residual adds read and write (its bound is read bandwidth).
enum class ProfilePart : int {
  kProjections, kExperts, kAttention, kIndexer, kDeltaRule, kGlue, kSharedExperts, kDenseFfn
};
inline constexpr int kProfileParts = 8;
inline constexpr const char* kProfilePartNames[kProfileParts] = {
    "projections", "experts", "attention", "indexer", "delta_rule", "glue", "shared_experts", "dense_ffn"};
// Rows: LayerKind (mla, dsa, delta, gqa), then the parts outside the layers
// (embedding, final norm, LM head).
inline constexpr int kProfileRows = 5;
inline constexpr int kProfileModelRow = kProfileRows - 1;
inline constexpr const char* kProfileRowNames[kProfileRows] = {"mla", "dsa", "delta", "gqa", "model"};
struct ForwardProfile {
  double seconds[kProfileRows][kProfileParts] = {};
  double flops[kProfileRows][kProfileParts] = {};
  double bytes[kProfileRows][kProfileParts] = {};
};

// Optional observations of a forward pass, for tests and metrics.
struct ForwardTrace {
  // dsa_selected[layer][query index in the batch] = sorted selected positions
  std::map<int, std::vector<std::vector<int>>> dsa_selected;
  bool record_dsa = true;  // false: leave dsa_selected alone (a profile-only trace)
  // Not owned; accumulated into (never reset) by every pass that gets it.
  ForwardProfile* profile = nullptr;
};

struct ModelWeights;
struct LayerWeights;
struct SegmentRows;

// The moe-dsa-v1 family's FamilyModel (family.hpp); other families whose
// checkpoints map onto this layer graph (deepseek_v32, qwen3_next) load
// through it too, from a ModelDir whose `source` gives the engine's tensors.
class Model final : public FamilyModel {
 public:
  static Result<std::unique_ptr<Model>> Load(const ModelDir& dir, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  ModelConfig Describe() const override { return config_; }
  const ModelOptions& options() const { return options_; }
  // Also chooses the kernels the model runs with (a KernelSet, see
  // moeserve/kernels/cpu_kernels.hpp).
  void set_options(const ModelOptions& o);
  // Floats one token occupies in a KvPool row (all attention layers).
  size_t cache_floats_per_token() const override { return floats_per_token_; }
  // Where attention layer `layer`'s parts start in a token's floats (its
  // latent c | k_pe, then for DSA the indexer key: KvPool::PartRow). A
  // DeltaNet layer keeps nothing in the pool: its entry is the next
  // attention layer's offset.
  size_t layer_cache_offset(int layer) const { return layer_offset_[static_cast<size_t>(layer)]; }
  // Where each cache part starts in a token's floats: a KvPool stripe each.
  std::vector<size_t> cache_stripes() const override { return cache_stripes_; }
  // A cache with zeroed DeltaNet state and no blocks.
  SequenceCache NewSequence() const override;
  int vocab_size() const override { return config_.vocab_size; }
  int64_t max_position() const override { return config_.max_position_embeddings; }
  std::vector<int> ExpertCounts() const override;

  // Appends each segment's tokens to its cache (blocks must already cover
  // them: EnsureBlocks) and writes logits rows (vocab_size floats each) in
  // segment order. expert_tokens, when given, is incremented per routed
  // (layer, expert).
  Status Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits,
                 ForwardTrace* trace = nullptr, std::vector<std::vector<uint64_t>>* expert_tokens = nullptr) const override;

  // Multi-token prediction (model.md 15; ModelOptions::mtp and a checkpoint
  // with the module): every Forward also runs the MTP module over the
  // positions whose next token it knows, writing the module's own cache
  // rows; ProposeDrafts chains it greedily from each slot's last position.
  bool has_mtp() const;
  int draft_depth() const override { return has_mtp() ? kMaxDraftChain : 0; }
  Status ProposeDrafts(KvPool& pool, std::span<DraftSlot> slots) const override;
  // The most tokens one ProposeDrafts chains (EngineOptions::draft_tokens' bound).
  static constexpr int kMaxDraftChain = 4;
  // One step of the module for each input (what ProposeDrafts runs per
  // token): the input hidden row, the token after the position, the
  // position. Writes the module's cache row at that position (the cache's
  // blocks must cover it) and, per input, its vocab_size() logits and its
  // output hidden row (before mtp.0.norm: the next step's input). For tests
  // and the drafts alike.
  struct MtpInput {
    SequenceCache* cache = nullptr;
    const float* hidden = nullptr;
    int token = 0;
    int64_t position = 0;
  };
  Status MtpStep(KvPool& pool, std::span<const MtpInput> inputs, std::vector<float>* logits,
                 std::vector<float>* hidden_out) const;

  const VisionConfig* vision() const override { return config_.vision ? &*config_.vision : nullptr; }
  // The vision tower on this model's kernels (engine/vision/tower.hpp).
  Result<std::vector<float>> EmbedImage(const ImageInput& image) const override;

  // Bytes the loaded weights keep in memory on this rank (its experts only
  // under expert parallelism).
  size_t resident_weight_bytes() const;
  // Of those, the routed experts' bytes: under expert parallelism this
  // rank's slice, 1/world of the model's.
  size_t routed_expert_bytes() const;
  // What a decode step reads of them (family.hpp; weights.hpp DecodeReadBytes).
  DecodeWeightBytes decode_weight_bytes() const override;
  // Expert parallelism: this rank, the world size (1 without), and the stats.
  int ep_rank() const { return ep_rank_; }
  int ep_world() const { return ep_world_; }
  ExpertParallelStats expert_parallel_stats() const;

  // ---- Expert parallelism led by rank 0 (the daemon) ----
  // Rank 0 calls Forward as a single process would; before each pass it
  // broadcasts the pass (forward_plan.hpp) and the followers, inside
  // Follow(), run the same pass on their replicas of the attention state.
  // These methods are thread-safe.
  //
  // Connects (or, with null, disconnects) the group. A new group is a new
  // epoch: sequences that started under an earlier one fail with
  // kUnavailable, since the followers' state for them is gone.
  void SetGroup(kernels::comm::Communicator* comm) const;
  // Rank 0, when idle: keeps the followers' wait bounded, and finds out
  // whether they are still there (kUnavailable when the group failed).
  Status Heartbeat() const;
  // Rank 0: ends every follower's Follow() with Ok.
  Status StopFollowers() const;
  // Rank 0: the sequence ended; followers drop its state with the next message.
  void Retire(const SequenceCache& cache) const override;
  // Ranks > 0: runs rank 0's passes until StopFollowers (Ok), `stop`, or a
  // failure of the group (kUnavailable; SetGroup a new one and follow again).
  Status Follow(KvPool& pool, const std::atomic<bool>& stop) const;

 private:
  Model() = default;
  ModelConfig config_;
  ModelOptions options_;
  const kernels::KernelSet* kernels_ = nullptr;  // from options_.kernels
  bool absorbed_prefill_ = false;                // from options_.mla_form and the kernels
  std::unique_ptr<ModelWeights> weights_;
  size_t floats_per_token_ = 0;
  std::vector<size_t> layer_offset_;  // each attention layer's first part's offset in a token's floats
  std::vector<size_t> cache_stripes_;
  std::vector<float> rope_freqs_;     // qk_rope_head_dim / 2 YaRN frequencies
  std::vector<float> gqa_rope_freqs_; // gqa.rotary_dim / 2 frequencies (gated GQA layers)
  float mla_scale_ = 0;
  size_t mtp_offset_ = 0;             // the MTP block's attention part's offset in a token's floats
  // x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x)) for one decoder block over
  // the batch (the trunk's layers and the MTP block alike).
  Status RunBlock(const LayerWeights& w, int layer, size_t cache_offset, KvPool& pool, std::span<const SegmentRows> rows,
                  std::vector<float>& x, std::vector<float>& normed, std::vector<float>& branch, ForwardTrace* trace,
                  std::vector<uint64_t>* layer_tokens, kernels::comm::Communicator* comm, ExpertParallelStats& ep) const;
  // The MTP module over n rows (segments of consecutive positions): input
  // hidden h [n, D], the next tokens; x ends as its output hidden [n, D].
  Status MtpBlock(KvPool& pool, std::span<const SegmentRows> rows, const float* h, const int* tokens, int n,
                  std::vector<float>& x) const;
  // After the trunk of a Forward: keeps each segment's last hidden rows and
  // runs the MTP block over the positions whose next token is known.
  Status MtpAfterTrunk(KvPool& pool, std::span<ForwardSegment> segments, std::span<const SegmentRows> rows,
                       const std::vector<float>& x) const;
  Status ForwardLocal(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                      std::vector<std::vector<uint64_t>>* expert_tokens, kernels::comm::Communicator* comm) const;
  Status BroadcastPlanLocked(uint8_t kind, std::span<ForwardSegment> segments) const;
  int ep_rank_ = 0, ep_world_ = 1;
  mutable std::mutex group_mu_;                          // serialises the group's collectives
  mutable kernels::comm::Communicator* comm_ = nullptr;  // lockstep (options) or led (SetGroup)
  mutable bool led_ = false;
  mutable uint64_t group_epoch_ = 0;
  mutable std::mutex retired_mu_;
  mutable std::vector<uint64_t> retired_;
  mutable std::atomic<uint64_t> next_key_{1};
  mutable std::mutex ep_mu_;  // guards ep_stats_ (Forward writes, any thread reads)
  mutable ExpertParallelStats ep_stats_;
};

}  // namespace moeserve::engine

#include "moeserve/engine/model.hpp"

#include <algorithm>
#include <unordered_map>

#include "layers.hpp"
#include "forward_plan.hpp"
#include "moe_parallel.hpp"
#include "scratch_heap.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/kernels/comm/exchange.hpp"
#include "moeserve/kernels/comm/communicator.hpp"
#include "moeserve/engine/tensor_layout.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "moeserve/kernels/cpu_ops.hpp"
#include "moeserve/kernels/indexer_int8.hpp"
#include "moeserve/kernels/mxfp4_activation_bits.hpp"
#include "vision/tower.hpp"
#include "weights.hpp"

namespace moeserve::engine {

Model::~Model() = default;

void Model::set_options(const ModelOptions& o) {
  // The indexer keys' layout in the pool is the loaded model's (Load).
  const IndexerScores layout = options_.indexer_scores;
  const bool loaded = weights_ != nullptr;
  options_ = o;
  if (loaded) options_.indexer_scores = layout;
  // The kernels, chosen here once: the reference set, or the best this CPU
  // runs. kAuto's prefill form goes with them (model.hpp): the reference
  // kernels run the spec's expanded form, the fast ones the absorbed form.
  const bool reference = o.kernels == KernelChoice::kReference;
  // Deterministic: one form for every segment length, so that a token
  // prefilled in any chunk, or decoded, runs the same code.
  const kernels::Isa isa = reference ? kernels::Isa::kReference : kernels::BestIsa();
  kernels_ = o.deterministic ? &kernels::KernelsBatchInvariant(isa)
             : reference     ? &kernels::Kernels(isa)
                             : &kernels::KernelsWithDecodeActivationBits(isa, o.decode_activation_bits, o.bf16_activations);
  absorbed_prefill_ = o.deterministic ? o.mla_form != MlaForm::kExpanded
                                      : o.mla_form == MlaForm::kAbsorbed || (o.mla_form == MlaForm::kAuto && !reference);
}

Result<std::unique_ptr<Model>> Model::Load(const ModelDir& dir, const ModelOptions& options) {
  KeepScratchInHeap();
  std::unique_ptr<Model> model(new Model());
  model->config_ = dir.config;
  model->set_options(options);
  model->ep_rank_ = options.ep_rank;
  model->ep_world_ = options.ep_world;
  if (options.comm) {
    model->ep_rank_ = options.comm->rank();
    model->ep_world_ = options.comm->size();
    model->comm_ = options.comm;
  }
  model->ep_stats_.rank_rows.assign(static_cast<size_t>(model->ep_world_), 0);
  if (options.experts && *options.experts != dir.config.expert_format)
    return Fail(Error::InvalidArgument(
        "experts: " + std::string(ExpertFormatName(*options.experts)) + " requested, but " + dir.path +
        " holds its routed experts as " + std::string(ExpertFormatName(dir.config.expert_format)) +
        " (requantisation at load is offered by the deepseek_v32 and qwen3_next families, and by moe-dsa-v1 from BF16 to "
        "MXFP4, through the family registry)"));
  CheckpointSource mapped(dir.checkpoint);
  TensorSource& source = dir.source ? *dir.source : static_cast<TensorSource&>(mapped);
  // Multi-token prediction under expert parallelism would need the group
  // for an MoE block and the followers to replay each draft: not offered,
  // the module stays unloaded (drafts fall back to lookup).
  bool load_mtp = options.mtp && dir.config.num_nextn_predict_layers > 0;
  if (load_mtp && model->ep_world_ > 1) {
    log::Info("multi-token prediction: not loaded under expert parallelism (world " + std::to_string(model->ep_world_) +
              "); speculative decoding falls back to lookup drafts");
    load_mtp = false;
  }
  const bool int8_index = options.indexer_scores == IndexerScores::kInt8;
  if (int8_index && (dir.config.HasKind(LayerKind::kDsa) || dir.config.mtp_kind == LayerKind::kDsa) &&
      !kernels::IndexerInt8DimSupported(dir.config.dsa.index_head_dim))
    return Fail(Error::InvalidArgument("indexer_scores int8: dsa.index_head_dim " +
                                       std::to_string(dir.config.dsa.index_head_dim) +
                                       " is not a multiple of 4 up to 1024; use exact scores"));
  MOE_ASSIGN_OR_RETURN(ModelWeights w, LoadWeights(source, dir.config, model->ep_rank_, model->ep_world_, load_mtp));
  model->weights_ = std::make_unique<ModelWeights>(std::move(w));
  for (const LayerWeights& lw : model->weights_->layers)
    if (lw.kind == LayerKind::kDelta)
      FindDeltaDistinctHeads(lw, dir.config.delta.num_heads, dir.config.delta.head_k_dim);
  const ModelConfig& c = model->config_;
  // Token row layout: for each mla/dsa layer [c | k_pe | indexer key (dsa):
  // index_head_dim floats, or with int8 scores index_head_dim / 4 + 1],
  // for each gqa layer [k | v] of every kv head; DeltaNet layers keep state
  // in the sequence, not in the row.
  // The MTP block, when loaded, has its own attention slot after them.
  const auto slot_floats = [&](LayerKind kind) -> size_t {
    if (kind == LayerKind::kDelta) return 0;
    if (kind == LayerKind::kGqa) return 2 * static_cast<size_t>(c.gqa.num_kv_heads) * static_cast<size_t>(c.gqa.head_dim);
    size_t n = static_cast<size_t>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
    if (kind == LayerKind::kDsa)
      n += int8_index ? kernels::IndexerInt8KeyFloats(c.dsa.index_head_dim) : static_cast<size_t>(c.dsa.index_head_dim);
    return n;
  };
  // Each part of a slot is a KvPool stripe of its own: the latent rows, a
  // DSA layer's indexer keys, a GQA layer's keys and values.
  size_t off = 0;
  const auto add_slot = [&](LayerKind kind) {
    const size_t floats = slot_floats(kind);
    if (floats == 0) return;
    model->cache_stripes_.push_back(off);
    if (kind == LayerKind::kDsa)
      model->cache_stripes_.push_back(off + static_cast<size_t>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim));
    off += floats;
  };
  for (int i = 0; i < c.num_layers; ++i) {
    model->layer_offset_.push_back(off);
    add_slot(c.layer_types[i]);
  }
  if (model->weights_->mtp) {
    model->mtp_offset_ = off;
    add_slot(c.mtp_kind);
  }
  model->floats_per_token_ = std::max<size_t>(off, 1);
  if (c.NeedsMla()) {
    model->rope_freqs_ = RopeFrequencies(c);
    model->mla_scale_ = MlaSoftmaxScale(c);
  }
  if (c.HasKind(LayerKind::kGqa)) model->gqa_rope_freqs_ = GqaRopeFrequencies(c.gqa);
  return model;
}

Result<std::vector<float>> Model::EmbedImage(const ImageInput& image) const {
  if (!config_.vision || !weights_->vision)
    return Fail(Error::InvalidArgument("this model has no vision tower: image input is refused"));
  return RunVisionTower(*config_.vision, *weights_->vision, config_.hidden_size, *kernels_, image);
}

size_t Model::resident_weight_bytes() const { return ResidentWeightBytes(*weights_); }
size_t Model::routed_expert_bytes() const { return RoutedExpertBytes(*weights_); }
DecodeWeightBytes Model::decode_weight_bytes() const {
  return DecodeReadBytes(*weights_, config_.moe.experts_per_token);
}

ExpertParallelStats Model::expert_parallel_stats() const {
  std::lock_guard<std::mutex> lock(ep_mu_);
  return ep_stats_;
}

SequenceCache Model::NewSequence() const {
  SequenceCache cache;
  cache.ep_key = next_key_++;
  cache.delta.resize(static_cast<size_t>(config_.num_layers));
  const DeltaConfig& d = config_.delta;
  for (int i = 0; i < config_.num_layers; ++i) {
    if (config_.layer_types[i] != LayerKind::kDelta) continue;
    const size_t channels = static_cast<size_t>(2 * d.num_heads * d.head_k_dim + d.num_heads * d.head_v_dim);
    cache.delta[static_cast<size_t>(i)].conv_tail.assign(static_cast<size_t>(d.conv_size - 1) * channels, 0.0f);
    cache.delta[static_cast<size_t>(i)].S.assign(static_cast<size_t>(d.num_heads) * d.head_k_dim * d.head_v_dim, 0.0f);
  }
  return cache;
}

std::vector<int> Model::ExpertCounts() const {
  std::vector<int> counts(static_cast<size_t>(config_.num_layers), 0);
  for (int i = 0; i < config_.num_layers; ++i)
    if (config_.IsMoeLayer(i)) counts[static_cast<size_t>(i)] = config_.moe.num_experts;
  return counts;
}

Status Model::RunBlock(const LayerWeights& w, int layer, size_t cache_offset, KvPool& pool, std::span<const SegmentRows> rows,
                       std::vector<float>& x, std::vector<float>& normed, std::vector<float>& branch, ForwardTrace* trace,
                       std::vector<uint64_t>* layer_tokens, kernels::comm::Communicator* comm, ExpertParallelStats& ep) const {
  const ModelConfig& c = config_;
  const int D = c.hidden_size;
  const int N = static_cast<int>(x.size() / static_cast<size_t>(D));
  const float eps = static_cast<float>(c.rms_norm_eps);
  const double hidden_bytes = 4.0 * N * D;  // one read or write of the hidden states
  const kernels::KernelSet& ks = *kernels_;
  ForwardProfile* profile = trace ? trace->profile : nullptr;
  // Profile rows are the layer kinds (kProfileRowNames).
  static_assert(static_cast<int>(LayerKind::kGqa) == 3 && kProfileModelRow == 4);
  PartClock clock(profile, static_cast<int>(w.kind));
  const bool gqa = w.kind == LayerKind::kGqa;
  LayerContext ctx{c, options_, ks, absorbed_prefill_, pool, rows, layer, cache_offset,
                   gqa ? gqa_rope_freqs_ : rope_freqs_, mla_scale_, trace, clock};
  // h = x + Attn(RMSNorm(x; attn_norm))
  const auto norm_rows = [&](const std::vector<float>& weight) {
    ForRows(N, [&](int t) {
      ks.rms_norm(&x[static_cast<size_t>(t) * D], weight.data(), eps, static_cast<size_t>(D), &normed[static_cast<size_t>(t) * D]);
    });
  };
  norm_rows(w.attn_norm);
  clock.Mark(ProfilePart::kGlue, 0, 2 * hidden_bytes);
  if (w.kind == LayerKind::kDelta) GatedDeltaNet(ctx, w, normed.data(), N, branch.data());
  else if (gqa) GatedGqaAttention(ctx, w, normed.data(), N, branch.data());
  else MlaAttention(ctx, w, normed.data(), N, branch.data());
  const auto add_branch = [&] {
    ForRows(N, [&](int t) {
      for (size_t j = static_cast<size_t>(t) * D; j < static_cast<size_t>(t + 1) * D; ++j) x[j] += branch[j];
    });
  };
  add_branch();
  // y = h + FFN(RMSNorm(h; ffn_norm))
  norm_rows(w.ffn_norm);
  clock.Mark(ProfilePart::kGlue, 0, 5 * hidden_bytes);
  if (w.moe && comm) {
    MOE_TRY(MoeFfnParallel(c, w, normed.data(), N, branch.data(), layer_tokens, ks, *comm, ep));
    clock.Mark(ProfilePart::kExperts);
  } else if (w.moe) {
    MoeFfn(c, w, normed.data(), N, branch.data(), layer_tokens, ks, &clock);
  } else {
    DenseFfn(w, normed.data(), N, branch.data(), ks, &clock);
  }
  add_branch();
  clock.Mark(ProfilePart::kGlue, 0, 3 * hidden_bytes);
  return Ok();
}

namespace {
// Trunk rows a sequence keeps for the MTP module: a whole verification
// segment's (the sampled token and a draft of up to Model::kMaxDraftChain),
// so that any rollback within it finds its row, and a few more. (A row is
// hidden-size floats: 28 KB at DeepSeek-V3.2's 7168.)
constexpr int kMtpKeptRows = 8;
static_assert(kMtpKeptRows >= Model::kMaxDraftChain + 1);
}  // namespace

bool Model::has_mtp() const { return weights_ && weights_->mtp != nullptr; }

Status Model::MtpBlock(KvPool& pool, std::span<const SegmentRows> rows, const float* h, const int* tokens, int n,
                       std::vector<float>& x) const {
  const MtpWeights& m = *weights_->mtp;
  const int D = config_.hidden_size, V = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const kernels::KernelSet& ks = *kernels_;
  for (int t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      return Fail(Error::InvalidArgument("multi-token prediction: token id " + std::to_string(tokens[t]) + " out of range"));
  // h' = eh_proj(concat(RMSNorm(embed[t]; enorm), RMSNorm(h; hnorm))): the
  // embedding half first, as DeepSeek-V3's MTP module.
  const size_t D2 = 2 * static_cast<size_t>(D);
  std::vector<float> cat(static_cast<size_t>(n) * D2);
  ForRows(n, [&](int t) {
    ks.rms_norm(&weights_->embed.w[static_cast<size_t>(tokens[t]) * D], m.enorm.data(), eps, static_cast<size_t>(D),
                &cat[static_cast<size_t>(t) * D2]);
    ks.rms_norm(h + static_cast<size_t>(t) * D, m.hnorm.data(), eps, static_cast<size_t>(D), &cat[static_cast<size_t>(t) * D2 + D]);
  });
  x.resize(static_cast<size_t>(n) * D);
  Linear(m.eh_proj, cat.data(), n, x.data(), ks);
  std::vector<float> normed(x.size()), branch(x.size());
  ExpertParallelStats unused;
  // Layer index num_layers: past the trunk's (no trace records it, and no
  // expert counts are kept for it).
  return RunBlock(m.block, config_.num_layers, mtp_offset_, pool, rows, x, normed, branch, nullptr, nullptr, nullptr, unused);
}

Status Model::MtpAfterTrunk(KvPool& pool, std::span<ForwardSegment> segments, std::span<const SegmentRows> rows,
                            const std::vector<float>& x) const {
  const int D = config_.hidden_size;
  const size_t Ds = static_cast<size_t>(D);
  // For a segment at positions [a, b]: MTP positions [a - 1, b - 1], the
  // first from the row kept by the previous pass (skipped without one: the
  // first chunk, a prefix-cache hit, a rollback past the kept rows).
  std::vector<SegmentRows> mtp_rows;
  std::vector<float> h;
  std::vector<int> next;
  int n = 0;
  for (size_t k = 0; k < segments.size(); ++k) {
    const SegmentRows& sr = rows[k];
    SequenceCache& cache = *sr.cache;
    const int64_t a = sr.pos0;
    const int64_t kept = static_cast<int64_t>(cache.mtp_hidden.size() / Ds);
    const bool before = a > 0 && a - 1 >= cache.mtp_hidden_pos0 && a - 1 < cache.mtp_hidden_pos0 + kept;
    const int m = sr.n - 1 + (before ? 1 : 0);
    if (m > 0) {
      mtp_rows.push_back({&cache, n, m, before ? a - 1 : a});
      if (before) {
        const float* row = &cache.mtp_hidden[static_cast<size_t>(a - 1 - cache.mtp_hidden_pos0) * Ds];
        h.insert(h.end(), row, row + D);
        next.push_back(segments[k].tokens[0]);
      }
      h.insert(h.end(), x.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(sr.row0) * Ds),
               x.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(sr.row0 + sr.n - 1) * Ds));
      next.insert(next.end(), segments[k].tokens.begin() + 1, segments[k].tokens.end());
      n += m;
    }
    const int keep = std::min(sr.n, kMtpKeptRows);
    cache.mtp_hidden.assign(x.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(sr.row0 + sr.n - keep) * Ds),
                            x.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(sr.row0 + sr.n) * Ds));
    cache.mtp_hidden_pos0 = a + sr.n - keep;
  }
  if (n == 0) return Ok();
  std::vector<float> out;
  return MtpBlock(pool, mtp_rows, h.data(), next.data(), n, out);
}

Status Model::MtpStep(KvPool& pool, std::span<const MtpInput> inputs, std::vector<float>* logits,
                      std::vector<float>* hidden_out) const {
  if (!has_mtp()) return Fail(Error::InvalidArgument("this model has no multi-token-prediction layers loaded"));
  const int D = config_.hidden_size, V = config_.vocab_size;
  const int n = static_cast<int>(inputs.size());
  std::vector<SegmentRows> rows;
  std::vector<float> h(static_cast<size_t>(n) * D);
  std::vector<int> tokens;
  for (int i = 0; i < n; ++i) {
    const MtpInput& in = inputs[static_cast<size_t>(i)];
    if (!in.cache || !in.hidden || in.position < 0)
      return Fail(Error::InvalidArgument("multi-token prediction: an input without a cache, a hidden row or a position"));
    if (static_cast<int64_t>(in.cache->blocks.size()) * pool.block_tokens() <= in.position)
      return Fail(Error::Internal("multi-token prediction: cache blocks do not cover position " + std::to_string(in.position)));
    rows.push_back({in.cache, i, 1, in.position});
    std::copy_n(in.hidden, D, &h[static_cast<size_t>(i) * D]);
    tokens.push_back(in.token);
  }
  if (n == 0) return Ok();
  std::vector<float> x;
  MOE_TRY(MtpBlock(pool, rows, h.data(), tokens.data(), n, x));
  if (logits) {
    const kernels::KernelSet& ks = *kernels_;
    const float eps = static_cast<float>(config_.rms_norm_eps);
    std::vector<float> normed(x.size());
    for (int t = 0; t < n; ++t)
      ks.rms_norm(&x[static_cast<size_t>(t) * D], weights_->mtp->norm.data(), eps, static_cast<size_t>(D),
                  &normed[static_cast<size_t>(t) * D]);
    logits->resize(static_cast<size_t>(n) * V);
    Linear(weights_->head, normed.data(), n, logits->data(), ks);
  }
  if (hidden_out) *hidden_out = std::move(x);
  return Ok();
}

Status Model::ProposeDrafts(KvPool& pool, std::span<DraftSlot> slots) const {
  if (!has_mtp()) return Fail(Error::InvalidArgument("this model has no multi-token-prediction layers loaded"));
  const int D = config_.hidden_size, V = config_.vocab_size;
  const size_t Ds = static_cast<size_t>(D);
  // A chain: its input hidden row, the token after its position, the
  // position, the tokens left to propose, the ids it may propose.
  struct Chain {
    DraftSlot* slot;
    std::vector<float> hidden;
    int token;
    int64_t position;
    int left;
    int ids;
  };
  std::vector<Chain> chains;
  for (DraftSlot& slot : slots) {
    if (!slot.cache || !slot.out) return Fail(Error::InvalidArgument("draft slot without a cache or an output"));
    if (slot.next_token < 0 || slot.next_token >= V)
      return Fail(Error::InvalidArgument("draft slot: token id " + std::to_string(slot.next_token) + " out of range"));
    const SequenceCache& cache = *slot.cache;
    const int64_t last = cache.length - 1;  // the position the chain starts at: h_last and next_token
    const int64_t kept = static_cast<int64_t>(cache.mtp_hidden.size() / Ds);
    // Without the trunk's row there (a prefix-cache hit not yet extended, a
    // rollback past the kept rows) the slot gets no draft: drafts only ever
    // cost acceptance.
    if (last < 0 || last < cache.mtp_hidden_pos0 || last >= cache.mtp_hidden_pos0 + kept) continue;
    // Step s writes the module's row at last + s: within the blocks.
    const int64_t covered = static_cast<int64_t>(cache.blocks.size()) * pool.block_tokens() - last;
    const int left = static_cast<int>(std::min<int64_t>({slot.max_tokens, kMaxDraftChain, covered}));
    if (left <= 0) continue;
    const float* row = &cache.mtp_hidden[static_cast<size_t>(last - cache.mtp_hidden_pos0) * Ds];
    const int ids = slot.sampled_ids > 0 ? std::min(slot.sampled_ids, V) : V;
    chains.push_back({&slot, std::vector<float>(row, row + D), slot.next_token, last, left, ids});
  }
  // One pass of the module per chain step, every live chain in it.
  std::vector<MtpInput> inputs;
  std::vector<float> logits, hidden;
  while (!chains.empty()) {
    inputs.clear();
    for (const Chain& c : chains) inputs.push_back({c.slot->cache, c.hidden.data(), c.token, c.position});
    MOE_TRY(MtpStep(pool, inputs, &logits, &hidden));
    std::vector<Chain> live;
    for (size_t i = 0; i < chains.size(); ++i) {
      Chain& c = chains[i];
      // Greedy: the largest logit among the ids that may be sampled (ties: the lower id).
      const float* l = &logits[i * static_cast<size_t>(V)];
      int best = 0;
      for (int v = 1; v < c.ids; ++v)
        if (l[v] > l[best]) best = v;
      c.slot->out->push_back(best);
      if (--c.left == 0) continue;
      std::copy_n(&hidden[i * Ds], D, c.hidden.data());
      c.token = best;
      ++c.position;
      live.push_back(std::move(c));
    }
    chains = std::move(live);
  }
  return Ok();
}

Status Model::ForwardLocal(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                           std::vector<std::vector<uint64_t>>* expert_tokens, kernels::comm::Communicator* comm) const {
  const ModelConfig& c = config_;
  const int D = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (ep_world_ > 1 && !comm)
    return Fail(Error::Unavailable("the expert-parallel group is not connected: this rank holds only its own experts"));

  // Lay the segments out as consecutive rows of one batch.
  std::vector<SegmentRows> rows;
  int N = 0;
  for (auto& s : segments) {
    if (s.tokens.empty()) return Fail(Error::InvalidArgument("forward: empty segment"));
    if (static_cast<int64_t>(s.cache->blocks.size()) * pool.block_tokens() < s.cache->length + static_cast<int64_t>(s.tokens.size()))
      return Fail(Error::Internal("forward: cache blocks do not cover the new tokens (call EnsureBlocks)"));
    rows.push_back({s.cache, N, static_cast<int>(s.tokens.size()), s.cache->length, s.state_trail});
    N += static_cast<int>(s.tokens.size());
  }

  // x_0 = embed[token]
  std::vector<float> x(static_cast<size_t>(N) * D), normed(x.size()), branch(x.size());
  int r = 0;
  for (auto& s : segments) {
    const int row0 = r;
    for (int tok : s.tokens) {
      if (tok < 0 || tok >= V) return Fail(Error::InvalidArgument("forward: token id " + std::to_string(tok) + " out of range"));
      std::copy_n(&weights_->embed.w[static_cast<size_t>(tok) * D], D, &x[static_cast<size_t>(r++) * D]);
    }
    // Image tokens: the tower's rows in place of the embedding (model.md 14.5).
    for (const RowEmbedding& e : s.embeddings) {
      if (e.index < 0 || e.index >= static_cast<int>(s.tokens.size()) || !e.values)
        return Fail(Error::Internal("forward: an input row outside its segment"));
      std::copy_n(e.values, D, &x[static_cast<size_t>(row0 + e.index) * D]);
    }
  }

  ForwardProfile* profile = trace ? trace->profile : nullptr;
  constexpr int kModelRow = kProfileModelRow;  // embedding, final norm, head
  const double hidden_bytes = 4.0 * N * D;     // one read or write of the hidden states
  PartClock model_clock(profile, kModelRow);
  model_clock.Mark(ProfilePart::kGlue, 0, hidden_bytes);
  const kernels::KernelSet& ks = *kernels_;
  ExpertParallelStats ep;
  ep.rank_rows.assign(static_cast<size_t>(ep_world_), 0);
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& w = weights_->layers[static_cast<size_t>(i)];
    std::vector<uint64_t>* layer_tokens = expert_tokens ? &(*expert_tokens)[static_cast<size_t>(i)] : nullptr;
    MOE_TRY(RunBlock(w, i, layer_offset_[static_cast<size_t>(i)], pool, rows, x, normed, branch, trace, layer_tokens, comm, ep));
  }
  // Multi-token prediction: the MTP module over the positions whose next
  // token this pass knows, writing its own cache rows (logits not needed).
  if (weights_->mtp) MOE_TRY(MtpAfterTrunk(pool, segments, rows, x));
  model_clock.Skip();  // the layers timed themselves

  for (auto& s : segments) s.cache->length += static_cast<int64_t>(s.tokens.size());
  if (comm) {
    std::lock_guard<std::mutex> lock(ep_mu_);
    ep_stats_.layers += ep.layers;
    ep_stats_.computed_rows += ep.computed_rows;
    for (size_t r = 0; r < ep.rank_rows.size(); ++r) ep_stats_.rank_rows[r] += ep.rank_rows[r];
  }

  // logits_t = head(RMSNorm(y_t; norm)) for the rows asked for.
  if (logits) {
    std::vector<int> want;
    for (size_t k = 0; k < segments.size(); ++k) {
      if (segments[k].all_logits)
        for (int t = 0; t < rows[k].n; ++t) want.push_back(rows[k].row0 + t);
      else
        want.push_back(rows[k].row0 + rows[k].n - 1);
    }
    std::vector<float> final_norm(want.size() * static_cast<size_t>(D));
    for (size_t k = 0; k < want.size(); ++k)
      ks.rms_norm(&x[static_cast<size_t>(want[k]) * D], weights_->norm.data(), eps, static_cast<size_t>(D), &final_norm[k * D]);
    model_clock.Mark(ProfilePart::kGlue, 0, 8.0 * want.size() * D);
    logits->resize(want.size() * static_cast<size_t>(V));
    Linear(weights_->head, final_norm.data(), static_cast<int>(want.size()), logits->data(), ks);
    model_clock.Mark(ProfilePart::kProjections, LinearFlops({&weights_->head}, static_cast<int>(want.size())));
  }
  return Ok();
}

Status Model::Forward(KvPool& pool, std::span<ForwardSegment> segments, std::vector<float>* logits, ForwardTrace* trace,
                      std::vector<std::vector<uint64_t>>* expert_tokens) const {
  std::unique_lock<std::mutex> lock(group_mu_);
  if (!led_) {
    // A single process, or lockstep (every rank's caller runs the same passes).
    kernels::comm::Communicator* comm = comm_;
    lock.unlock();
    return ForwardLocal(pool, segments, logits, trace, expert_tokens, comm);
  }
  if (!comm_)
    return Fail(Error::Unavailable("the expert-parallel group is not connected (waiting for every rank to join)"));
  if (ep_rank_ != 0) return Fail(Error::Internal("forward on expert-parallel rank " + std::to_string(ep_rank_) + ": followers run Follow()"));
  // The broadcast plan carries token ids only: followers could not rebuild
  // an image's rows.
  for (auto& s : segments)
    if (!s.embeddings.empty())
      return Fail(Error::InvalidArgument("image input is not supported with expert parallelism"));
  for (auto& s : segments) {
    if (s.cache->length == 0) {
      s.cache->ep_group = group_epoch_;
    } else if (s.cache->ep_group != group_epoch_) {
      return Fail(Error::Unavailable("the expert-parallel group re-formed while this sequence was running; "
                                     "its state on the other ranks is gone"));
    }
  }
  MOE_TRY(BroadcastPlanLocked(static_cast<uint8_t>(ForwardPlan::Kind::kForward), segments));
  return ForwardLocal(pool, segments, logits, trace, expert_tokens, comm_);
}

Status Model::BroadcastPlanLocked(uint8_t kind, std::span<ForwardSegment> segments) const {
  if (ep_world_ == 1) return Ok();  // nobody to tell
  ForwardPlan plan;
  plan.kind = static_cast<ForwardPlan::Kind>(kind);
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    plan.retired.swap(retired_);
  }
  for (const auto& s : segments)
    plan.segments.push_back({s.cache->ep_key, s.cache->length, s.all_logits, {s.tokens.begin(), s.tokens.end()},
                             s.cache->blocks});
  auto sent = kernels::comm::BroadcastBytes(*comm_, EncodeForwardPlan(plan), 0);
  if (!sent) return Fail(Error::Unavailable("expert-parallel group: " + sent.error().message));
  return Ok();
}

void Model::SetGroup(kernels::comm::Communicator* comm) const {
  std::lock_guard<std::mutex> lock(group_mu_);
  comm_ = comm;
  led_ = true;
  group_epoch_++;
  std::lock_guard<std::mutex> retired_lock(retired_mu_);
  retired_.clear();  // the followers start from nothing
}

Status Model::Heartbeat() const {
  std::lock_guard<std::mutex> lock(group_mu_);
  if (!comm_) return Fail(Error::Unavailable("the expert-parallel group is not connected"));
  return BroadcastPlanLocked(static_cast<uint8_t>(ForwardPlan::Kind::kHeartbeat), {});
}

Status Model::StopFollowers() const {
  std::lock_guard<std::mutex> lock(group_mu_);
  if (!comm_) return Ok();
  return BroadcastPlanLocked(static_cast<uint8_t>(ForwardPlan::Kind::kStop), {});
}

void Model::Retire(const SequenceCache& cache) const {
  if (ep_world_ == 1 || cache.ep_key == 0) return;
  std::lock_guard<std::mutex> lock(retired_mu_);
  retired_.push_back(cache.ep_key);
}

Status Model::Follow(KvPool& pool, const std::atomic<bool>& stop) const {
  kernels::comm::Communicator* comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    comm = comm_;
  }
  if (!comm) return Fail(Error::Unavailable("the expert-parallel group is not connected"));
  if (ep_rank_ == 0) return Fail(Error::Internal("rank 0 leads; it does not follow"));
  // This rank's replicas of the sequences' attention state, by key. Block
  // tables come from rank 0 (same pool geometry), so blocks are not allocated here.
  std::unordered_map<uint64_t, SequenceCache> seqs;
  while (!stop.load()) {
    auto msg = kernels::comm::BroadcastBytes(*comm, {}, 0);
    if (!msg) return Fail(Error::Unavailable("expert-parallel group: " + msg.error().message));
    MOE_ASSIGN_OR_RETURN(ForwardPlan plan, DecodeForwardPlan(*msg));
    for (uint64_t k : plan.retired) seqs.erase(k);
    if (plan.kind == ForwardPlan::Kind::kStop) return Ok();
    if (plan.kind == ForwardPlan::Kind::kHeartbeat) continue;
    std::vector<ForwardSegment> segments;
    for (const auto& s : plan.segments) {
      auto it = seqs.find(s.key);
      if (it == seqs.end()) {
        if (s.pos0 != 0)
          return Fail(Error::Internal("follower: rank 0 continues sequence " + std::to_string(s.key) + " at position " +
                                      std::to_string(s.pos0) + ", which this rank never started"));
        it = seqs.emplace(s.key, NewSequence()).first;
      }
      SequenceCache& c = it->second;
      if (c.length != s.pos0)
        return Fail(Error::Internal("follower: sequence " + std::to_string(s.key) + " is at position " + std::to_string(c.length) +
                                    " here and at " + std::to_string(s.pos0) + " on rank 0"));
      for (int b : s.blocks)
        if (b < 0 || b >= pool.num_blocks())
          return Fail(Error::Corruption("forward plan", "block " + std::to_string(b) + " outside this rank's pool"));
      c.blocks = s.blocks;
      segments.push_back({&c, s.tokens, s.all_logits});
    }
    MOE_TRY(ForwardLocal(pool, segments, nullptr, nullptr, nullptr, comm));
  }
  return Ok();
}

}  // namespace moeserve::engine

#include "moeserve/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "moeserve/common/exception_text.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/engine/context_bytes.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "moeserve/engine/sampler.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "families/moe_dsa_v1/family.hpp"
#include "image_embedder.hpp"
#include "prefix_cache.hpp"
#include "speculation/prompt_lookup.hpp"

namespace moeserve::engine {

namespace {

struct Sequence {
  SequenceId id = 0;
  GenerationRequest req;
  std::vector<int> tokens;  // prompt, then every emitted token
  int64_t prompt_len = 0;
  int64_t snapshot_at = 0;  // block-aligned prompt prefix whose state the prefix cache keeps
  int64_t public_at = 0;    // block-aligned end of the public prefix, kept for every tenant (0: none)
  SequenceCache cache;
  // The vision tower's rows of each image of req.images ([tokens, hidden]),
  // taken from the tower's job when a prefill chunk reaches the image and
  // dropped once the prompt is prefilled (model.md 14.5).
  std::vector<std::vector<float>> image_rows;
  // Per image, its job on the tower thread (queued at admission for every
  // image the prefix cache did not cover; empty once its rows are taken).
  // Destroying the sequence drops the jobs it still has.
  std::vector<ImageEmbedder::Job> tower_jobs;
  std::mt19937_64 rng;
  std::unique_ptr<ReasoningTracker> reasoning;  // the family's reading of the chat format
  SequenceUsage usage;
  // Speculative decoding (engine.hpp SpeculativeMode): the mode the request
  // runs, the draft the coming step verifies and where it came from, the
  // lookup index (built on first use) and the recurrent state after each
  // verified token (the rollback points).
  SpeculativeMode speculative = SpeculativeMode::kOff;
  std::vector<int> draft;
  SpeculativeMode draft_kind = SpeculativeMode::kOff;
  std::vector<int> verify_tokens;  // [the sampled token, the draft...]: the verification segment
  // Drafts pay only when they are accepted: after a draft the model refused
  // outright the sequence drafts again only after 1, 2, 4 ... 16 steps
  // (draft_misses in a row), and a draft is one token longer than the last
  // one kept (up to draft_tokens), so a sequence that stopped copying stops
  // paying for it. Speed only: the tokens are the model's either way.
  int draft_misses = 0;
  int draft_cooldown = 0;
  int draft_len = 0;  // 0: draft_tokens
  std::unique_ptr<PromptLookup> lookup;
  std::vector<std::vector<DeltaLayerState>> state_trail;
};

// Submit fills an empty stop list with the family's defaults.
bool IsStop(const Sequence& s, int token) {
  return std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), token) != s.req.stop_tokens.end();
}

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<FamilyModel> model;
  const Model* layer_graph = nullptr;  // model, when it is the shared layer graph
  ModelConfig description;             // model->Describe(), what config() answers
  std::shared_ptr<const ChatHooks> chat;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<PrefixCache> prefix;
  int max_context = 0;
  int64_t sequence_state_bytes = 0;  // one sequence's recurrent state (RecurrentStateBytes), for Submit's refusals
  // The vision tower's thread (null for a model without a tower).
  std::unique_ptr<ImageEmbedder> tower;

  mutable std::mutex mu;  // guards the fields below and the metrics
  // Set by Submit, Cancel, PinPrefix and a finished tower job, cleared when
  // a step takes its inputs: a step that found only sequences waiting for
  // the tower sleeps on step_cv until it is set.
  bool step_news = false;
  std::condition_variable step_cv;
  SequenceId next_id = 1;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::set<SequenceId> cancels;
  struct PinUpdate {
    uint64_t key;
    std::vector<int> tokens;
    double expiry;  // steady_clock seconds
  };
  std::vector<PinUpdate> pin_updates;  // applied to the prefix cache by the step thread
  int running_count = 0;
  EngineMetrics metrics;

  std::vector<std::unique_ptr<Sequence>> running;  // Step thread only
  int tower_waits = 0;  // Step thread only: sequences the last Advance skipped for want of a tower result

  int64_t BlocksFor(int64_t tokens) const { return (tokens + options.block_tokens - 1) / options.block_tokens; }

  // The phases of Step(); each appends its events.
  void CancelAndAdmit(std::vector<TokenEvent>& events);
  // True when it ran a forward pass.
  bool Advance(std::vector<TokenEvent>& events);
  // Sleeps until step_news: called when a step ran nothing because every
  // sequence waits for the tower.
  void WaitForNews();
  // Flags step_news and wakes a sleeping step.
  void Notify();
  // True when the sequence may run: blocks for its whole length are held.
  // False: the pool is full, it waits (and holds nothing).
  bool Admit(Sequence& s);
  // Queues the tower jobs of the images that s still has to prefill.
  void QueueImages(Sequence& s);
  // The prompt position before which every image's rows are in hand for a
  // chunk of s starting at `start` (takes finished jobs' rows); the tower's
  // error when a job failed.
  Result<int64_t> ImagesReadyUntil(Sequence& s, int64_t start);
  // The rows of the image tokens in prompt positions [start, end) of s, as
  // RowEmbeddings relative to start (ImagesReadyUntil made sure they are in hand).
  Status ImageRows(Sequence& s, int64_t start, int64_t end, std::vector<RowEmbedding>& out);
  // Emits the sequence's next token(s) from one row of logits; true when it
  // finished. With a draft token: the row verifies it (VerifyDraftToken),
  // and *accepted says whether the sequence goes on with it (the token was
  // the draft, and nothing was forced after it).
  bool Emit(Sequence& s, std::span<float> logits, std::vector<TokenEvent>& events, std::optional<int> draft = {},
            bool* accepted = nullptr);
  // Emits from a verification's rows (draft.size() + 1 of them) until a
  // draft token is refused, then rolls the cache back to the tokens kept;
  // true when the sequence finished.
  bool EmitVerified(Sequence& s, const float* rows, int64_t pos0, std::vector<TokenEvent>& events);
  // The drafts of this step's decoding sequences (ProposeDrafts for MTP,
  // the lookup index for lookup); none when the step has more decoding
  // sequences than options.speculative_max_batch.
  void ProposeDrafts(const std::vector<Sequence*>& decoding);
  void Finish(Sequence& s, FinishReason why, int token, bool reasoning, bool forced, std::vector<TokenEvent>& events);
  // Ends the sequence with kError; the message is logged and goes to the client.
  void FailSequence(Sequence& s, const std::string& what, std::vector<TokenEvent>& events, bool unavailable = false);
  void PublishMetrics();
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The tower's thread first: its on_done wakes this engine's step, so it must
// be joined while the rest of Impl is alive. Queued jobs never run.
Engine::~Engine() {
  if (impl_ && impl_->tower) impl_->tower->Stop();
}

ModelOptions ModelOptionsFor(const EngineOptions& options) {
  ModelOptions mo;
  mo.kernels = options.kernels;
  mo.bf16_activations = options.bf16_activations;
  mo.experts = options.experts;
  mo.decode_activation_bits = options.decode_activation_bits;
  mo.indexer_scores = options.indexer_scores;
  mo.deterministic = options.deterministic;
  mo.ep_rank = options.ep_rank;
  mo.ep_world = options.ep_world;
  mo.mtp = options.speculative == SpeculativeMode::kMtp || options.speculative == SpeculativeMode::kAuto;
  return mo;
}

Result<std::unique_ptr<Engine>> Engine::Create(const ModelDir& model_dir, const EngineOptions& options) {
  MOE_TRY(ValidateEngineOptions(options));
  // A ModelDir gets moe-dsa-v1's chat hooks: other families open by Open().
  if (model_dir.family != "moe-dsa-v1")
    return Fail(Error::InvalidArgument(model_dir.path + ": model family '" + model_dir.family +
                                       "' has its own chat hooks: open it with Engine::Open"));
  FamilyParts parts;
  MOE_ASSIGN_OR_RETURN(parts.model, Model::Load(model_dir, ModelOptionsFor(options)));
  parts.chat = MoeDsaV1Chat();
  return Create(std::move(parts), options);
}

Result<std::unique_ptr<Engine>> Engine::Open(const std::string& dir, const EngineOptions& options) {
  MOE_TRY(ValidateEngineOptions(options));
  MOE_ASSIGN_OR_RETURN(const FamilyEntry* family, FindFamily(dir));
  MOE_ASSIGN_OR_RETURN(FamilyParts parts, family->load(dir, ModelOptionsFor(options)));
  return Create(std::move(parts), options);
}

Status Engine::ValidateEngineOptions(const EngineOptions& options) {
  // cache_tokens 0: sized from cache_memory_bytes in Create.
  const bool pool_from_memory = options.cache_tokens == 0 && options.cache_memory_bytes > 0;
  if (options.block_tokens <= 0 || (!pool_from_memory && options.cache_tokens < options.block_tokens) ||
      options.max_running <= 0 ||
      options.prefill_chunk_tokens <= 0 || options.prefill_chunk_tokens_idle <= 0 || options.max_waiting < 0)
    return Fail(Error::InvalidArgument(
        "engine options: block_tokens, cache_tokens, max_running, prefill_chunk_tokens and prefill_chunk_tokens_idle "
        "must be positive"));
  if (!kernels::RequestDefaultThreadPoolSize(options.threads))
    log::Warn("engine: threads=" + std::to_string(options.threads) +
              " ignored: the kernel thread pool was already started with another size");
  if (options.prefix_cache_bytes < 0)
    return Fail(Error::InvalidArgument("engine options: prefix_cache_bytes must not be negative"));
  if (options.cache_memory_bytes < 0)
    return Fail(Error::InvalidArgument("engine options: cache_memory_bytes must not be negative"));
  if (!options.prefix_disk_dir.empty() && options.prefix_disk_bytes <= 0)
    return Fail(Error::InvalidArgument("engine options: prefix_disk_bytes must be positive when prefix_disk_dir is set"));
  if (!(options.prefix_disk_max_age_seconds >= 0) || !std::isfinite(options.prefix_disk_max_age_seconds))
    return Fail(Error::InvalidArgument("engine options: prefix_disk_max_age_seconds must be 0 (no bound) or positive"));
  if (options.decode_activation_bits != 21 && options.decode_activation_bits != 16 &&
      options.decode_activation_bits != 8)
    return Fail(Error::InvalidArgument("engine options: decode_activation_bits must be 21, 16 or 8, not " +
                                       std::to_string(options.decode_activation_bits)));
  if (options.deterministic && options.ep_world > 1)
    return Fail(Error::InvalidArgument("engine options: deterministic decode is not available with expert parallelism"));
  if (options.draft_tokens < 1 || options.draft_tokens > 4)
    return Fail(Error::InvalidArgument("engine options: draft_tokens must be 1 to 4, not " +
                                       std::to_string(options.draft_tokens)));
  if (options.speculative_max_batch < 0)
    return Fail(Error::InvalidArgument("engine options: speculative_max_batch must not be negative"));
  return Ok();
}

Result<std::unique_ptr<Engine>> Engine::Create(FamilyParts parts, const EngineOptions& options) {
  MOE_TRY(ValidateEngineOptions(options));
  if (!parts.model || !parts.chat) return Fail(Error::InvalidArgument("engine: a family needs a model and chat hooks"));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.ep_world > 1 && options.prefix_cache) {
    log::Info("engine: prefix cache off under expert parallelism (followers hold no copy of its snapshots)");
    impl->options.prefix_cache = false;
  }
  impl->prefix = std::make_unique<PrefixCache>(options.prefix_cache_bytes, 4096, std::clamp(options.prefix_pin_share, 0.0, 1.0));
  impl->model = std::move(parts.model);
  impl->layer_graph = dynamic_cast<const Model*>(impl->model.get());
  impl->description = impl->model->Describe();
  if (impl->description.architecture.empty()) impl->description.architecture = parts.chat->family();
  if (impl->model->vision()) {
    Impl* m = impl.get();
    impl->tower = std::make_unique<ImageEmbedder>(
        [m](const ImageInput& image) { return m->model->EmbedImage(image); }, [m] { m->Notify(); });
  }
  impl->chat = std::move(parts.chat);
  if (options.speculative == SpeculativeMode::kMtp && impl->model->draft_depth() == 0)
    return Fail(Error::InvalidArgument("speculative decoding 'mtp': this model has no multi-token-prediction layers "
                                       "(use 'lookup' or 'auto', which drafts by lookup alone then)"));
  if (options.speculative != SpeculativeMode::kOff && options.ep_world > 1) {
    log::Info("engine: speculative decoding off under expert parallelism (followers keep no rollback points)");
    impl->options.speculative = SpeculativeMode::kOff;
  }
  // The group (ExpertGroup, Model::SetGroup) is formed on the layer graph:
  // a family with its own forward pass holds every expert or refuses the slice.
  if (options.ep_world > 1 && !impl->layer_graph)
    return Fail(Error::InvalidArgument("expert parallelism is not supported for " + impl->chat->family() +
                                       " models: only families on the shared layer graph (moe-dsa-v1, deepseek_v32, "
                                       "qwen3_next) split their experts"));
  impl->sequence_state_bytes = RecurrentStateBytes(impl->model->NewSequence());
  if (options.cache_tokens == 0) {  // sized from the memory budget (ValidateEngineOptions allowed it)
    impl->options.cache_tokens =
        std::min<int64_t>(PoolTokensFor(options.cache_memory_bytes, impl->model->cache_floats_per_token(),
                                        options.block_tokens, impl->sequence_state_bytes, options.max_running),
                          int64_t{1} << 40);
    const ContextBytes pool_cost = ContextCost(impl->model->cache_floats_per_token(), options.block_tokens,
                                               impl->sequence_state_bytes, impl->options.cache_tokens);
    log::Info("engine: KV cache pool sized from memory: " + std::to_string(impl->options.cache_tokens) + " tokens (" +
              HumanBytes(pool_cost.pool_bytes) + ", " +
              std::to_string(impl->model->cache_floats_per_token() * sizeof(float)) + " bytes per token) of a " +
              HumanBytes(options.cache_memory_bytes) + " budget, after " + std::to_string(options.max_running) +
              " sequences' recurrent state of " + HumanBytes(impl->sequence_state_bytes) + " each");
  }
  const int64_t blocks = impl->options.cache_tokens / options.block_tokens;
  try {
    impl->pool = std::make_unique<KvPool>(blocks, options.block_tokens, impl->model->cache_floats_per_token(),
                                          impl->model->cache_stripes());
  } catch (const std::bad_alloc&) {
    return Fail(Error::ResourceExhausted("KV cache pool of " + std::to_string(impl->options.cache_tokens) +
                                        " tokens could not be allocated; lower cache_tokens"));
  }
  if (!options.prefix_disk_dir.empty() && impl->options.prefix_cache) {
    PrefixDiskTier::Options d;
    d.dir = options.prefix_disk_dir;
    d.max_bytes = options.prefix_disk_bytes;
    d.max_age_seconds = options.prefix_disk_max_age_seconds;
    d.block_tokens = options.block_tokens;
    d.floats_per_token = impl->model->cache_floats_per_token();
    for (const DeltaLayerState& l : impl->model->NewSequence().delta) d.delta_shape.emplace_back(l.conv_tail.size(), l.S.size());
    // What makes a stored row valid for this engine: the model and the
    // options that change the values computed.
    d.model_identity = impl->chat->family() + "|" + impl->description.ToJson() +
                       "|kernels=" + std::to_string(static_cast<int>(options.kernels)) +
                       "|bf16=" + std::to_string(options.bf16_activations) +
                       "|experts=" + (options.experts ? std::string(ExpertFormatName(*options.experts)) : "stored") +
                       "|decode_bits=" + std::to_string(options.decode_activation_bits) +
                       // The indexer keys' layout in the rows (int8: a quarter of the bytes).
                       "|indexer_scores=" + (options.indexer_scores == IndexerScores::kInt8 ? "int8" : "exact") +
                       "|deterministic=" + std::to_string(options.deterministic);
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<PrefixDiskTier> tier, PrefixDiskTier::Open(std::move(d)));
    impl->prefix->AttachDiskTier(std::move(tier), *impl->pool);
  }
  int64_t ctx = impl->model->max_position();
  if (options.max_context > 0) ctx = std::min<int64_t>(ctx, options.max_context);
  ctx = std::min<int64_t>(ctx, blocks * options.block_tokens);  // one sequence must fit the pool
  impl->max_context = static_cast<int>(std::min<int64_t>(ctx, 1 << 30));
  const std::vector<int> experts = impl->model->ExpertCounts();
  impl->metrics.expert_tokens.resize(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) impl->metrics.expert_tokens[i].assign(static_cast<size_t>(experts[i]), 0);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelConfig& Engine::config() const { return impl_->description; }
const Model* Engine::model() const { return impl_->layer_graph; }
const FamilyModel& Engine::family_model() const { return *impl_->model; }
const ChatHooks& Engine::chat() const { return *impl_->chat; }
int Engine::max_context() const { return impl_->max_context; }

Result<SequenceId> Engine::Submit(GenerationRequest request) {
  const int V = impl_->model->vocab_size();
  const int padding = impl_->chat->sampled_ids();
  if (request.prompt.empty()) return Fail(Error::InvalidArgument("the prompt is empty"));
  // Image tokens are padding ids of the text vocabulary: accepted only where
  // ValidateImageSpans put them, in spans that carry their pixels.
  const VisionConfig* vision = impl_->model->vision();
  if (!request.images.empty()) {
    if (!vision) return Fail(Error::InvalidArgument("this model has no vision tower: image input is refused"));
    if (impl_->options.ep_world > 1)
      return Fail(Error::InvalidArgument("image input is not supported with expert parallelism"));
  }
  if (vision) MOE_TRY(ValidateImageSpans(*vision, request.prompt, request.images));
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    int id = request.prompt[i];
    if (id < 0 || id >= V) return Fail(Error::InvalidArgument("prompt token " + std::to_string(i) + " has id " + std::to_string(id) + ", outside the vocabulary"));
    const bool image_token = vision && (id == vision->image_token_id || id == vision->image_start_token_id ||
                                        id == vision->image_end_token_id);
    if (id >= padding && !image_token) return Fail(Error::InvalidArgument("prompt token " + std::to_string(i) + " is padding id " + std::to_string(id) + ", which is refused in input"));
  }
  if (request.max_tokens < 1) return Fail(Error::InvalidArgument("max_tokens must be at least 1"));
  if (request.logprobs < -1 || request.logprobs > 20)
    return Fail(Error::InvalidArgument("logprobs must be -1 (off) or 0 to 20 alternatives, got " + std::to_string(request.logprobs)));
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > impl_->max_context) {
    const std::string asked = "context length exceeded: the prompt has " + std::to_string(request.prompt.size()) +
                              " tokens and max_tokens is " + std::to_string(request.max_tokens) + ", " +
                              std::to_string(total) + " tokens together";
    const EngineOptions& o = impl_->options;
    const int64_t pool_tokens = o.cache_tokens / o.block_tokens * o.block_tokens;
    if (total > pool_tokens && impl_->max_context >= pool_tokens) {
      // The pool is the limit: it could not hold this even empty. Say what it costs and what raises it.
      const size_t fpt = impl_->model->cache_floats_per_token();
      const ContextBytes need = ContextCost(fpt, o.block_tokens, impl_->sequence_state_bytes, total);
      const ContextBytes have = ContextCost(fpt, o.block_tokens, 0, pool_tokens);
      return Fail(Error::OutOfRange(
          asked + ", which need " + HumanBytes(need.pool_bytes) + " of KV cache (" + std::to_string(fpt * sizeof(float)) +
          " bytes per token) plus " + HumanBytes(need.state_bytes) + " of recurrent state, but the KV cache pool holds " +
          std::to_string(pool_tokens) + " tokens (" + HumanBytes(have.pool_bytes) +
          ") even when empty; this deployment's context window is " + std::to_string(impl_->max_context) +
          " tokens (raise cache_tokens to serve longer contexts)"));
    }
    return Fail(Error::OutOfRange(asked + ", but this deployment's context window is " +
                                  std::to_string(impl_->max_context) + " tokens (the model's " +
                                  std::to_string(impl_->model->max_position()) + " positions, or max_context)"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->prompt_len = static_cast<int64_t>(request.prompt.size());
  seq->tokens = request.prompt;
  seq->rng.seed(request.sampling.seed);
  if (request.stop_tokens.empty()) request.stop_tokens = impl_->chat->DefaultStops();
  seq->reasoning = impl_->chat->NewTracker(request);
  seq->usage.prompt_tokens = static_cast<int>(seq->prompt_len);
  const SpeculativeMode mode = request.speculative.value_or(impl_->options.speculative);
  if (mode == SpeculativeMode::kMtp && impl_->model->draft_depth() == 0)
    return Fail(Error::InvalidArgument(
        "speculative: 'mtp' needs the model's multi-token-prediction layers, and none are loaded (the model has "
        "none, or the deployment's speculative setting is neither mtp nor auto); use 'lookup' or 'auto'")
                    .WithField("speculative"));
  seq->speculative = impl_->options.ep_world > 1 ? SpeculativeMode::kOff : mode;
  seq->req = std::move(request);
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (static_cast<int>(impl_->waiting.size()) >= impl_->options.max_waiting)
    return Fail(Error::ResourceExhausted("the request queue is full (" + std::to_string(impl_->options.max_waiting) + " waiting)"));
  seq->id = impl_->next_id++;
  SequenceId id = seq->id;
  impl_->waiting.push_back(std::move(seq));
  impl_->metrics.waiting = static_cast<int>(impl_->waiting.size());
  impl_->step_news = true;
  impl_->step_cv.notify_all();
  return id;
}

void Engine::Cancel(SequenceId id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cancels.insert(id);
  impl_->step_news = true;
  impl_->step_cv.notify_all();
}

void Engine::PinPrefix(uint64_t key, std::vector<int> tokens, double seconds) {
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->pin_updates.push_back({key, std::move(tokens), seconds > 0 ? now + seconds : 0});
  impl_->step_news = true;
  impl_->step_cv.notify_all();
}

void Engine::Impl::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu);
    step_news = true;
  }
  step_cv.notify_all();
}

void Engine::Impl::WaitForNews() {
  std::unique_lock<std::mutex> lock(mu);
  step_cv.wait(lock, [&] { return step_news; });
}

void Engine::MaintainIdle() {
  // The prefix cache belongs to the stepping thread, which calls this.
  if (impl_->options.prefix_cache) impl_->prefix->ExpireDisk();
  impl_->PublishMetrics();
}

bool Engine::HasWork() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->waiting.empty() || impl_->running_count > 0 || !impl_->cancels.empty();
}

EngineMetrics Engine::Metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->metrics;
}

// Step's contract is "failures are events": every phase that calls out (the
// forward pass, a decode controller, allocations) catches what it calls and
// fails only the sequences it was working on. The catch here is the last
// line: whatever escapes it fails the running batch, never the caller.
std::vector<TokenEvent> Engine::Step() {
  Impl& m = *impl_;
  std::vector<TokenEvent> events;
  bool ran = false;
  try {
    m.CancelAndAdmit(events);
    ran = m.Advance(events);
  } catch (...) {
    const std::string what = "engine step failed: " + ExceptionText(std::current_exception());
    for (auto& sp : m.running) m.FailSequence(*sp, what, events);
    m.running.clear();
    m.tower_waits = 0;
  }
  m.PublishMetrics();
  // Every sequence waits for the tower: sleep until it answers (or a
  // submission, cancel or pin arrives) rather than have the caller spin.
  if (!ran && events.empty() && m.tower_waits > 0) {
    try {
      m.WaitForNews();
    } catch (...) {  // the caller steps again: nothing is lost
    }
  }
  return events;
}

void Engine::Impl::Finish(Sequence& s, FinishReason why, int token, bool reasoning, bool forced,
                          std::vector<TokenEvent>& events) {
  events.push_back({s.id, token, reasoning, forced, why, s.usage, {}, false, std::nullopt, {}});
  ReleaseBlocks(*pool, s.cache);
  model->Retire(s.cache);
}

void Engine::Impl::FailSequence(Sequence& s, const std::string& what, std::vector<TokenEvent>& events, bool unavailable) {
  log::Error("engine: sequence " + std::to_string(s.id) + " failed: " + what);
  ReleaseBlocks(*pool, s.cache);
  model->Retire(s.cache);
  events.push_back({s.id, -1, false, false, FinishReason::kError, s.usage, what, unavailable, std::nullopt, {}});
}

bool Engine::Impl::Admit(Sequence& s) {
  s.cache = model->NewSequence();
  // Reuse the longest cached prefix, leaving at least one prompt token to compute.
  if (options.prefix_cache) {
    PrefixCache::Hit hit = prefix->LookupOrRestore(*pool, s.tokens, s.prompt_len - 1, s.req.tenant,
                                                   s.req.public_prefix_tokens, s.req.images);
    if (hit.length > 0) {
      s.cache.delta = *hit.delta;  // the copy first: it may throw, the references may not leak
      s.cache.blocks = *hit.blocks;
      for (int b : s.cache.blocks) pool->Ref(b);
      s.cache.length = hit.length;
      s.usage.cached_tokens = static_cast<int>(hit.length);
    }
  }
  const int64_t total = s.prompt_len + s.req.max_tokens;
  const int64_t need = BlocksFor(total) - static_cast<int64_t>(s.cache.blocks.size());
  while (pool->free_blocks() < need && prefix->EvictOne(*pool, PrefixCache::Why::kPool)) {
  }
  if (pool->free_blocks() < need) {  // wait for running sequences to finish
    ReleaseBlocks(*pool, s.cache);
    s.cache.length = 0;
    s.usage.cached_tokens = 0;
    return false;
  }
  if (auto st = EnsureBlocks(*pool, s.cache, total); !st) {  // cannot happen: checked above
    ReleaseBlocks(*pool, s.cache);
    s.cache.length = 0;
    s.usage.cached_tokens = 0;
    return false;
  }
  s.snapshot_at = ((s.prompt_len - 1) / options.block_tokens) * options.block_tokens;
  s.public_at = (std::min(s.req.public_prefix_tokens, s.prompt_len - 1) / options.block_tokens) * options.block_tokens;
  return true;
}

// 1. Cancellations, then admission of waiting sequences while the pool has
//    room for their whole length (so a running sequence never runs out).
void Engine::Impl::CancelAndAdmit(std::vector<TokenEvent>& events) {
  std::set<SequenceId> taken_cancels;
  std::deque<std::unique_ptr<Sequence>> taken;
  std::vector<PinUpdate> pins;
  {
    std::lock_guard<std::mutex> lock(mu);
    taken_cancels.swap(cancels);
    taken.swap(waiting);
    pins.swap(pin_updates);
    step_news = false;
  }
  {
    // Round-robin across tenants (FairShareOrder), not first come first served.
    std::vector<std::string> tenants;
    tenants.reserve(taken.size());
    for (const auto& s : taken) tenants.push_back(s->req.tenant);
    std::deque<std::unique_ptr<Sequence>> ordered;
    for (size_t i : FairShareOrder(tenants)) ordered.push_back(std::move(taken[i]));
    taken.swap(ordered);
  }
  for (const auto& p : pins) prefix->SetPin(p.key, p.tokens, p.expiry);
  std::erase_if(running, [&](std::unique_ptr<Sequence>& s) {
    if (!taken_cancels.count(s->id)) return false;
    Finish(*s, FinishReason::kCancelled, -1, false, false, events);
    return true;
  });
  std::erase_if(taken, [&](std::unique_ptr<Sequence>& s) {
    if (!taken_cancels.count(s->id)) return false;
    events.push_back({s->id, -1, false, false, FinishReason::kCancelled, s->usage, {}, false, std::nullopt, {}});
    return true;
  });
  while (!taken.empty() && static_cast<int>(running.size()) < options.max_running) {
    Sequence& s = *taken.front();
    bool admitted = false;
    try {
      admitted = Admit(s);
      if (admitted) {
        QueueImages(s);  // before the move: a throw here fails s, which Admit made hold blocks
        running.push_back(std::move(taken.front()));
      }
    } catch (...) {
      FailSequence(s, "admitting the sequence failed: " + ExceptionText(std::current_exception()), events);
      taken.pop_front();
      continue;
    }
    if (!admitted) break;
    {
      std::lock_guard<std::mutex> lock(mu);
      metrics.prefix_lookup_tokens += static_cast<uint64_t>(running.back()->prompt_len);
      metrics.prefix_hit_tokens += static_cast<uint64_t>(running.back()->usage.cached_tokens);
    }
    taken.pop_front();
  }
  std::lock_guard<std::mutex> lock(mu);
  // Keep arrival order: sequences still waiting go before ones submitted meanwhile.
  while (!taken.empty()) {
    waiting.push_front(std::move(taken.back()));
    taken.pop_back();
  }
}

// 2. One batch: every decoding sequence's next token, plus prompt chunks up
//    to the prefill budget. A chunk stops at the block boundary where the
//    prefix cache snapshots DeltaNet state. 3. Prefix snapshots, then
//    sampling for sequences whose known tokens are all computed.
bool Engine::Impl::Advance(std::vector<TokenEvent>& events) {
  std::vector<ForwardSegment> segments;
  std::vector<Sequence*> owners;
  // Per segment, the rows its image tokens take (alive until Forward returns).
  std::vector<std::vector<RowEmbedding>> embeddings;
  embeddings.reserve(running.size());
  std::set<Sequence*> failed;
  // The larger budget when nothing decodes: no sequence waits on this step.
  std::vector<Sequence*> decoders;  // one token to compute, the prompt done: a decode step
  for (const auto& sp : running)
    if (static_cast<int64_t>(sp->tokens.size()) - sp->cache.length == 1 && sp->cache.length >= sp->prompt_len)
      decoders.push_back(sp.get());
  const bool decoding = !decoders.empty();
  ProposeDrafts(decoders);
  // The family may cap the idle enlargement (FamilyModel::idle_prefill_rows).
  const int family_cap = model->idle_prefill_rows();
  const int idle = family_cap > 0 ? std::min(options.prefill_chunk_tokens_idle, family_cap) : options.prefill_chunk_tokens_idle;
  int prefill_budget = decoding ? options.prefill_chunk_tokens : std::max(options.prefill_chunk_tokens, idle);
  tower_waits = 0;
  for (auto& sp : running) {
    Sequence& s = *sp;
    int64_t start = s.cache.length;
    int64_t end = static_cast<int64_t>(s.tokens.size());
    const bool reads_images = !s.req.images.empty() && start < s.prompt_len;
    if (end - start > 1 || start < s.prompt_len) {  // prefill (or a run of forced tokens)
      if (prefill_budget <= 0) continue;
      end = std::min<int64_t>(end, start + prefill_budget);
      if (options.prefix_cache && start < s.snapshot_at && end > s.snapshot_at) end = s.snapshot_at;
      if (options.prefix_cache && start < s.public_at && end > s.public_at) end = s.public_at;
      // The chunk ends before the first image whose rows the tower has not
      // given back yet; with nothing before it, the sequence sits this step out.
      if (reads_images) {
        Result<int64_t> ready = ImagesReadyUntil(s, start);
        if (!ready) {
          FailSequence(s, "the vision tower failed: " + ready.error().ToString(), events);
          failed.insert(&s);
          continue;
        }
        end = std::min(end, *ready);
        if (end <= start) {
          ++tower_waits;
          continue;
        }
      }
      prefill_budget -= static_cast<int>(end - start);
    }
    std::vector<RowEmbedding> rows;
    if (reads_images) {
      if (auto st = ImageRows(s, start, end, rows); !st) {
        FailSequence(s, "the vision tower failed: " + st.error().ToString(), events);
        failed.insert(&s);
        continue;
      }
    }
    embeddings.push_back(std::move(rows));
    if (!s.draft.empty()) {  // verify the draft: the sampled token and the draft, every row's logits
      s.verify_tokens.assign(1, s.tokens.back());
      s.verify_tokens.insert(s.verify_tokens.end(), s.draft.begin(), s.draft.end());
      ForwardSegment verify(&s.cache, s.verify_tokens, true);
      verify.state_trail = &s.state_trail;
      segments.push_back(verify);
    } else {
      segments.push_back({&s.cache, std::span<const int>(s.tokens.data() + start, static_cast<size_t>(end - start)),
                          false, embeddings.back()});
    }
    owners.push_back(&s);
  }
  if (!failed.empty())
    std::erase_if(running, [&](std::unique_ptr<Sequence>& s) { return failed.count(s.get()) > 0; });
  if (segments.empty()) return false;
  std::vector<float> logits;
  std::vector<std::vector<uint64_t>> expert_counts(metrics.expert_tokens.size());
  for (size_t i = 0; i < expert_counts.size(); ++i) expert_counts[i].assign(metrics.expert_tokens[i].size(), 0);
  Status st = Ok();
  try {
    st = model->Forward(*pool, segments, &logits, nullptr, &expert_counts);
  } catch (...) {
    st = Fail(Error::Internal(ExceptionText(std::current_exception())));
  }
  std::set<Sequence*> done;
  // Where each segment's logits start: one row, or one per token of a verification.
  std::vector<size_t> first_row(owners.size());
  for (size_t k = 0, r = 0; k < owners.size(); r += segments[k].all_logits ? segments[k].tokens.size() : 1, ++k)
    first_row[k] = r;
  if (!st) {
    // Inputs were validated at Submit and forced tokens at Emit, so this is a
    // bug or a library failure: the batch's caches are suspect, the batch
    // fails; sequences not in it were not touched and go on.
    const std::string what = "the forward pass failed: " + st.error().ToString();
    const bool unavailable = st.error().code() == ErrorCode::kUnavailable;
    for (Sequence* s : owners) {
      FailSequence(*s, what, events, unavailable);
      done.insert(s);
    }
  } else {
    const int V = model->vocab_size();
    for (size_t k = 0; k < owners.size(); ++k) {
      Sequence& s = *owners[k];
      if (options.prefix_cache && s.cache.length == s.public_at && s.public_at > 0) {
        try {
          prefix->Insert(*pool, s.tokens, s.public_at, s.cache, {}, /*is_public=*/true, s.req.images);
        } catch (...) {
          log::Warn("engine: public prefix snapshot not cached: " + ExceptionText(std::current_exception()));
        }
      }
      if (options.prefix_cache && s.cache.length == s.snapshot_at && s.snapshot_at > 0 && s.snapshot_at != s.public_at) {
        try {
          prefix->Insert(*pool, s.tokens, s.snapshot_at, s.cache, s.req.tenant, false, s.req.images);
        } catch (...) {  // the cache is unchanged; the sequence is fine
          log::Warn("engine: prefix snapshot not cached: " + ExceptionText(std::current_exception()));
        }
      }
      if (s.cache.length >= s.prompt_len && !s.image_rows.empty()) {  // the prompt is in the cache
        s.image_rows = {};
        s.tower_jobs.clear();
      }
      float* rows = logits.data() + first_row[k] * static_cast<size_t>(V);
      if (!s.draft.empty()) {
        try {
          if (EmitVerified(s, rows, s.cache.length - static_cast<int64_t>(segments[k].tokens.size()), events))
            done.insert(&s);
        } catch (...) {
          FailSequence(s, "the decode controller failed: " + ExceptionText(std::current_exception()), events);
          done.insert(&s);
        }
        continue;
      }
      if (s.cache.length < static_cast<int64_t>(s.tokens.size())) continue;
      std::span<float> row(rows, static_cast<size_t>(V));
      try {
        if (Emit(s, row, events)) done.insert(&s);
      } catch (...) {
        FailSequence(s, "the decode controller failed: " + ExceptionText(std::current_exception()), events);
        done.insert(&s);
      }
    }
  }
  std::erase_if(running, [&](std::unique_ptr<Sequence>& s) { return done.count(s.get()) > 0; });
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < expert_counts.size(); ++i)
    for (size_t e = 0; e < expert_counts[i].size(); ++e) metrics.expert_tokens[i][e] += expert_counts[i][e];
  return true;
}

void Engine::Impl::QueueImages(Sequence& s) {
  if (s.req.images.empty()) return;
  if (!tower) throw std::logic_error("a sequence with images on an engine without a vision tower");
  s.image_rows.assign(s.req.images.size(), {});
  s.tower_jobs.resize(s.req.images.size());
  for (size_t k = 0; k < s.req.images.size(); ++k) {
    const ImageSpan& span = s.req.images[k];
    if (span.offset + span.tokens > s.cache.length) s.tower_jobs[k] = tower->Enqueue(span.image);
  }
}

Result<int64_t> Engine::Impl::ImagesReadyUntil(Sequence& s, int64_t start) {
  for (size_t k = 0; k < s.req.images.size(); ++k) {
    const ImageSpan& span = s.req.images[k];
    if (span.offset + span.tokens <= start || !s.image_rows[k].empty()) continue;  // prefilled, or in hand
    ImageEmbedder::Job& job = s.tower_jobs[k];
    if (!job) return Fail(Error::Internal("image " + std::to_string(k) + " was never queued for the tower"));
    if (!job.ready()) return std::max(start, span.offset);
    MOE_ASSIGN_OR_RETURN(std::vector<float> rows, job.Take());
    if (rows.empty() || rows.size() % static_cast<size_t>(span.tokens) != 0)
      return Fail(Error::Internal("image " + std::to_string(k) + ": the tower gave " + std::to_string(rows.size()) +
                                  " floats for " + std::to_string(span.tokens) + " tokens"));
    s.image_rows[k] = std::move(rows);
  }
  return std::numeric_limits<int64_t>::max();
}

Status Engine::Impl::ImageRows(Sequence& s, int64_t start, int64_t end, std::vector<RowEmbedding>& out) {
  for (size_t k = 0; k < s.req.images.size(); ++k) {
    const ImageSpan& span = s.req.images[k];
    const int64_t lo = std::max(start, span.offset), hi = std::min(end, span.offset + span.tokens);
    if (lo >= hi) continue;  // this chunk does not reach the image
    if (s.image_rows[k].empty())
      return Fail(Error::Internal("image " + std::to_string(k) + ": a chunk reached it before its rows were ready"));
    const size_t D = s.image_rows[k].size() / static_cast<size_t>(span.tokens);  // the model's hidden size
    for (int64_t p = lo; p < hi; ++p)
      out.push_back({static_cast<int>(p - start), &s.image_rows[k][static_cast<size_t>(p - span.offset) * D]});
  }
  return Ok();
}

bool Engine::Impl::Emit(Sequence& s, std::span<float> row, std::vector<TokenEvent>& events, std::optional<int> draft,
                        bool* accepted) {
  const int V = model->vocab_size();
  bool took_draft = false;  // the row's token is the draft
  std::deque<std::pair<int, bool>> emit;  // (token, forced)
  std::optional<float> sampled_logprob;    // for the sampled token, when asked for
  std::vector<TokenLogprob> sampled_top;
  // A spent thinking budget closes the span instead of sampling (model.md 9),
  // as the family's chat format closes one.
  const bool budget_spent =
      s.reasoning->InReasoning() && s.req.thinking_budget >= 0 && s.usage.reasoning_tokens >= s.req.thinking_budget;
  if (budget_spent) {
    for (int t : chat->CloseReasoning()) emit.push_back({t, true});
  } else {
    // Only a request that asks for logprobs pays for them: they are read
    // from the raw logits, before the masks below change them.
    std::optional<TokenLogprobs> lp;
    const size_t ids = static_cast<size_t>(chat->sampled_ids());
    if (s.req.logprobs >= 0) lp.emplace(row, ids);
    for (size_t i = ids; i < row.size(); ++i) row[i] = -std::numeric_limits<float>::infinity();  // padding
    if (s.req.controller) s.req.controller->Mask(row);
    int t = -1;
    if (draft) {
      const DraftVerdict verdict = VerifyDraftToken(row, s.req.sampling, *draft, s.rng);
      t = verdict.token;
      took_draft = verdict.accepted;
    } else {
      t = SampleToken(row, s.req.sampling, s.rng);
    }
    if (t < 0) {  // the controller masked everything: the family ends the turn, or the sequence fails
      const std::optional<int> end = chat->AllMaskedToken();
      if (!end) {
        FailSequence(s, "the decode controller masked every token", events);
        return true;
      }
      t = *end;
      took_draft = false;
    }
    emit.push_back({t, false});
    if (lp) {
      sampled_logprob = lp->Of(t);
      sampled_top = lp->Top(s.req.logprobs);
    }
  }
  while (!emit.empty()) {
    auto [t, forced] = emit.front();
    emit.pop_front();
    if (t < 0 || t >= V) {  // the next forward pass would refuse it, and with it the whole batch
      FailSequence(s, "the decode controller forced token id " + std::to_string(t) + ", outside the vocabulary of " +
                          std::to_string(V), events);
      return true;
    }
    const bool reasoning = s.reasoning->Feed(t, IsStop(s, t));
    if (reasoning) ++s.usage.reasoning_tokens;
    s.tokens.push_back(t);
    ++s.usage.completion_tokens;
    FinishReason why = IsStop(s, t) ? FinishReason::kStop
                       : s.usage.completion_tokens >= s.req.max_tokens ? FinishReason::kLength
                                                                       : FinishReason::kNone;
    if (why != FinishReason::kNone) {
      Finish(s, why, t, reasoning, forced, events);
      if (!forced) events.back().logprob = sampled_logprob, events.back().top_logprobs = std::move(sampled_top);
      return true;
    }
    events.push_back({s.id, t, reasoning, forced, FinishReason::kNone, {}, {}, false, std::nullopt, {}});
    if (!forced) events.back().logprob = sampled_logprob, events.back().top_logprobs = std::move(sampled_top);
    if (s.req.controller)
      for (int f : s.req.controller->OnToken(t)) emit.push_back({f, true});
    // A forced token after the draft's: the sequence goes on with it, not
    // with the rest of the draft.
    if (!emit.empty()) took_draft = false;
  }
  if (accepted) *accepted = took_draft;
  return false;
}

bool Engine::Impl::EmitVerified(Sequence& s, const float* rows, int64_t pos0, std::vector<TokenEvent>& events) {
  const size_t V = static_cast<size_t>(model->vocab_size());
  const int k = static_cast<int>(s.draft.size());
  // Row i holds the logits after verify_tokens[i]: it checks draft[i], and
  // row k (every draft token accepted) gives one more token for free.
  std::vector<float> row(V);
  int kept = 0;
  bool finished = false;
  for (int i = 0; i <= k; ++i) {
    std::copy_n(rows + static_cast<size_t>(i) * V, V, row.begin());
    bool accepted = false;
    finished = Emit(s, row, events, i < k ? std::optional<int>(s.draft[static_cast<size_t>(i)]) : std::nullopt, &accepted);
    if (finished || i == k || !accepted) break;
    ++kept;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    DraftCounts& counts = s.draft_kind == SpeculativeMode::kMtp ? metrics.drafts_mtp : metrics.drafts_lookup;
    counts.proposed += static_cast<uint64_t>(k);
    counts.accepted += static_cast<uint64_t>(kept);
    ++counts.drafts;
  }
  s.draft.clear();
  if (kept == 0) {
    s.draft_misses = std::min(s.draft_misses + 1, 5);
    s.draft_cooldown = 1 << (s.draft_misses - 1);
  } else {
    s.draft_misses = 0;
  }
  s.draft_len = std::min(options.draft_tokens, kept + 1);
  if (finished) return true;
  // The cache keeps the sampled token and the accepted drafts; the rows past
  // them are rewritten before anything reads them, and the recurrent state
  // goes back to the point after the last token kept.
  const int64_t length = pos0 + 1 + kept;
  if (kept < k) {
    s.cache.length = length;
    if (static_cast<size_t>(kept) >= s.state_trail.size()) return false;  // no recurrent state to restore
    const std::vector<DeltaLayerState>& at = s.state_trail[static_cast<size_t>(kept)];
    for (size_t layer = 0; layer < at.size() && layer < s.cache.delta.size(); ++layer)
      if (!at[layer].S.empty()) {
        s.cache.delta[layer].S = at[layer].S;
        s.cache.delta[layer].conv_tail = at[layer].conv_tail;
      }
  }
  return false;
}

void Engine::Impl::ProposeDrafts(const std::vector<Sequence*>& decoding) {
  for (Sequence* s : decoding) s->draft.clear();
  if (static_cast<int>(decoding.size()) > options.speculative_max_batch) return;  // compute-bound: no drafts
  const int sampled_ids = chat->sampled_ids();
  // A draft stops before a padding id (image placeholders of the prompt:
  // the model never samples them).
  const auto trim = [&](std::vector<int>& draft) {
    const auto bad = std::find_if(draft.begin(), draft.end(), [&](int t) { return t < 0 || t >= sampled_ids; });
    draft.erase(bad, draft.end());
  };
  std::vector<std::vector<int>> mtp_out;
  std::vector<Sequence*> mtp_owners;
  for (Sequence* s : decoding) {
    if (s->speculative == SpeculativeMode::kOff) continue;
    if (s->draft_cooldown > 0) {
      --s->draft_cooldown;
      continue;
    }
    // Every draft token and the one after it count against max_tokens, and
    // the cache's blocks cover the prompt and max_tokens.
    const int room = s->req.max_tokens - s->usage.completion_tokens - 1;
    const int k = std::min(s->draft_len > 0 ? s->draft_len : options.draft_tokens, room);
    if (k <= 0) continue;
    if (s->speculative == SpeculativeMode::kLookup || s->speculative == SpeculativeMode::kAuto) {
      if (!s->lookup) s->lookup = std::make_unique<PromptLookup>();
      s->draft = s->lookup->Propose(s->tokens, k);
      trim(s->draft);
      s->draft_kind = SpeculativeMode::kLookup;
      if (!s->draft.empty()) continue;
    }
    if ((s->speculative == SpeculativeMode::kMtp || s->speculative == SpeculativeMode::kAuto) && model->draft_depth() > 0) {
      mtp_owners.push_back(s);
      mtp_out.emplace_back();
    }
  }
  if (mtp_owners.empty()) return;
  std::vector<DraftSlot> slots;
  for (size_t i = 0; i < mtp_owners.size(); ++i) {
    Sequence* s = mtp_owners[i];
    const int k = std::min({s->draft_len > 0 ? s->draft_len : options.draft_tokens,
                            s->req.max_tokens - s->usage.completion_tokens - 1, model->draft_depth()});
    slots.push_back({&s->cache, s->tokens.back(), k, &mtp_out[i], sampled_ids});
  }
  Status st = Ok();
  try {
    st = model->ProposeDrafts(*pool, slots);
  } catch (...) {
    st = Fail(Error::Internal(ExceptionText(std::current_exception())));
  }
  // A failed proposal costs the step its drafts, nothing else: the
  // sequences decode one token as without speculation.
  if (!st) {
    log::Warn("engine: multi-token-prediction drafts failed, decoding without them this step: " + st.error().ToString());
    return;
  }
  for (size_t i = 0; i < mtp_owners.size(); ++i) {
    Sequence* s = mtp_owners[i];
    s->draft = std::move(mtp_out[i]);
    if (static_cast<int>(s->draft.size()) > slots[i].max_tokens) s->draft.resize(static_cast<size_t>(slots[i].max_tokens));
    trim(s->draft);
    s->draft_kind = SpeculativeMode::kMtp;
  }
}

void Engine::Impl::PublishMetrics() {
  std::lock_guard<std::mutex> lock(mu);
  running_count = static_cast<int>(running.size());
  metrics.running = running_count;
  metrics.waiting = static_cast<int>(waiting.size());
  metrics.cache_usage_ratio = 1.0 - static_cast<double>(pool->free_blocks()) / static_cast<double>(pool->num_blocks());
  metrics.prefix_cache = prefix->Stats();
}

}  // namespace moeserve::engine

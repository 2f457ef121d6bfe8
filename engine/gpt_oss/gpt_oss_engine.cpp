// GptOssEngine (include/moeserve/engine/gpt_oss_engine.hpp): sequences,
// admission, chunked prefill and one-token decode steps over GptOssModel.
#include "moeserve/engine/gpt_oss_engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "moeserve/common/exception_text.hpp"
#include "moeserve/engine/sampler.hpp"

namespace moeserve::engine {

namespace {

// Which harmony message the generated tokens are in, so that analysis
// tokens are reported (and budgeted) as reasoning. Fed the prompt from its
// last <|start|> on, then every emitted token.
class ChannelTracker {
 public:
  ChannelTracker(const HfTokenizer& tokenizer, const HarmonyTokens& t) : tokenizer_(&tokenizer), t_(t) {}

  bool InAnalysisBody() const { return state_ == State::kBody && analysis_; }
  bool IsTerminator(int token) const { return token == t_.end || token == t_.call || token == t_.return_; }

  void Feed(int token) {
    if (token == t_.start) {
      state_ = State::kHeader;
      header_.clear();
      return;
    }
    switch (state_) {
      case State::kHeader:
        if (token == t_.message) {
          analysis_ = HeaderChannel() == "analysis";
          state_ = State::kBody;
        } else if (header_.size() < 64) {
          header_.push_back(token);
        }
        break;
      case State::kBody:
        if (IsTerminator(token)) {
          state_ = State::kOutside;
          analysis_ = false;
        }
        break;
      case State::kOutside:
        break;
    }
  }

 private:
  enum class State { kHeader, kBody, kOutside };
  // The word after <|channel|> in the header ("analysis", "final", ...).
  std::string HeaderChannel() const {
    auto it = std::find(header_.begin(), header_.end(), t_.channel);
    if (it == header_.end()) return "";
    std::vector<int> rest(it + 1, header_.end());
    auto stop = std::find_if(rest.begin(), rest.end(), [&](int id) { return id == t_.constrain || id == t_.channel; });
    rest.erase(stop, rest.end());
    std::istringstream words(tokenizer_->Decode(rest));
    std::string word;
    words >> word;
    return word;
  }

  const HfTokenizer* tokenizer_;
  HarmonyTokens t_;
  State state_ = State::kHeader;  // a generation starts after <|start|>assistant
  bool analysis_ = false;
  std::vector<int> header_;
};

}  // namespace

struct GptOssEngine::Impl {
  struct Sequence {
    SequenceId id = 0;
    GenerationRequest request;
    GptOssModel::State state;
    size_t prefilled = 0;       // prompt tokens already in the state
    std::vector<int> pending;   // emitted tokens not yet in the state
    std::deque<int> forced;     // tokens to emit next without sampling
    std::mt19937_64 rng;
    SequenceUsage usage;
    ChannelTracker channel;
    int64_t reserved = 0;       // prompt + max_tokens
    bool done = false;
  };

  GptOssEngineOptions options;
  std::unique_ptr<GptOssModel> model;
  HfTokenizer tokenizer;
  HarmonyTokens harmony;
  int max_context = 0;
  std::vector<int> default_stops;
  std::vector<int> close_analysis;  // <|end|><|start|>assistant<|channel|>final<|message|>

  // The prompt-state cache (Step thread only; figures in atomics for Metrics).
  struct CachedPrompt {
    std::vector<int> tokens;
    std::string tenant;      // only this tenant's prompts reuse it ...
    bool is_public = false;  // ... unless it is the public prefix (GenerationRequest::public_prefix_tokens)
    GptOssModel::State state;
    int64_t bytes = 0;
    uint64_t last_used = 0;
  };
  std::vector<CachedPrompt> cache;
  uint64_t cache_clock = 0;
  std::atomic<int64_t> cache_bytes{0}, cache_entries{0};
  std::atomic<uint64_t> lookup_tokens{0}, hit_tokens{0}, evicted{0}, too_large{0};

  mutable std::mutex mu;
  SequenceId next_id = 1;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::set<SequenceId> cancels;
  // Step thread only.
  std::vector<std::unique_ptr<Sequence>> running;
  std::atomic<int> running_count{0};
  std::atomic<int64_t> reserved{0};

  Impl(HfTokenizer tok) : tokenizer(std::move(tok)) {}

  std::unique_ptr<Sequence> NewSequence(SequenceId id, GenerationRequest request) {
    auto s = std::unique_ptr<Sequence>(new Sequence{
        id, std::move(request), model->NewState(), 0, {}, {}, std::mt19937_64{}, {}, ChannelTracker(tokenizer, harmony), 0,
        false});
    s->rng.seed(s->request.sampling.seed);
    s->usage.prompt_tokens = static_cast<int>(s->request.prompt.size());
    s->reserved = static_cast<int64_t>(s->request.prompt.size()) + s->request.max_tokens;
    if (s->request.stop_tokens.empty()) s->request.stop_tokens = default_stops;
    // The prompt may end inside a message (a prefilled header): read its last one.
    const auto& p = s->request.prompt;
    auto last_start = std::find(p.rbegin(), p.rend(), harmony.start);
    for (auto it = last_start == p.rend() ? p.end() : last_start.base() - 1; it != p.end(); ++it) s->channel.Feed(*it);
    return s;
  }

  TokenEvent Finished(Sequence& s, FinishReason why, std::string error = "") {
    TokenEvent e;
    e.id = s.id;
    e.finish = why;
    e.usage = s.usage;
    e.error = std::move(error);
    s.done = true;
    return e;
  }

  // Emits one token (sampled or forced) and decides whether it finishes.
  TokenEvent Emit(Sequence& s, int token, bool forced) {
    TokenEvent e;
    e.id = s.id;
    e.token = token;
    e.forced = forced;
    e.reasoning = s.channel.InAnalysisBody() && !s.channel.IsTerminator(token);
    ++s.usage.completion_tokens;
    if (e.reasoning) ++s.usage.reasoning_tokens;
    s.channel.Feed(token);
    s.pending.push_back(token);
    if (s.request.controller) {
      try {
        for (int t : s.request.controller->OnToken(token)) {
          if (t < 0 || t >= model->config().vocab) {
            e.finish = FinishReason::kError;
            e.error = "the decode controller forced token " + std::to_string(t) + ", outside the vocabulary";
            break;
          }
          s.forced.push_back(t);
        }
      } catch (...) {
        e.finish = FinishReason::kError;
        e.error = "the decode controller failed: " + ExceptionText(std::current_exception());
      }
    }
    if (e.finish == FinishReason::kNone) {
      const auto& stops = s.request.stop_tokens;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) e.finish = FinishReason::kStop;
      else if (s.usage.completion_tokens >= s.request.max_tokens) e.finish = FinishReason::kLength;
    }
    if (e.finish != FinishReason::kNone) {
      e.usage = s.usage;
      s.done = true;
    }
    return e;
  }

  static int64_t StateBytes(const GptOssModel::State& st, size_t tokens) {
    int64_t floats = 0;
    for (size_t l = 0; l < st.k.size(); ++l) floats += static_cast<int64_t>(st.k[l].size() + st.v[l].size());
    return floats * 4 + static_cast<int64_t>(tokens) * 4 + 256;
  }

  // Before the first prefill chunk: start from the longest kept prompt this one extends.
  void StartFromCache(Sequence& s) {
    const auto& prompt = s.request.prompt;
    lookup_tokens += prompt.size();
    CachedPrompt* best = nullptr;
    const size_t public_len = static_cast<size_t>(std::max<int64_t>(s.request.public_prefix_tokens, 0));
    for (auto& c : cache) {
      if (c.is_public ? c.tokens.size() > public_len : c.tenant != s.request.tenant) continue;
      if (c.tokens.size() < prompt.size() && (!best || c.tokens.size() > best->tokens.size()) &&
          std::equal(c.tokens.begin(), c.tokens.end(), prompt.begin()))
        best = &c;
    }
    if (!best) return;
    best->last_used = ++cache_clock;
    s.state = best->state;
    s.prefilled = best->tokens.size();
    s.usage.cached_tokens = static_cast<int>(best->tokens.size());
    hit_tokens += best->tokens.size();
  }

  // After the last prefill chunk: keep a copy of the state under the prompt
  // (for the sequence's tenant), or after the public prefix's (for every tenant).
  void KeepInCache(const Sequence& s, size_t length, bool is_public) {
    if (options.prefix_cache_bytes <= 0) return;
    const std::vector<int> prompt(s.request.prompt.begin(), s.request.prompt.begin() + static_cast<std::ptrdiff_t>(length));
    const std::string tenant = is_public ? std::string() : s.request.tenant;
    const int64_t bytes = StateBytes(s.state, prompt.size());
    if (bytes > options.prefix_cache_bytes) {
      ++too_large;
      return;
    }
    for (auto& c : cache) {
      if (c.tokens == prompt && c.is_public == is_public && c.tenant == tenant) {
        c.last_used = ++cache_clock;
        return;
      }
    }
    int64_t total = bytes;
    for (const auto& c : cache) total += c.bytes;
    while (total > options.prefix_cache_bytes && !cache.empty()) {
      auto lru = std::min_element(cache.begin(), cache.end(),
                                  [](const CachedPrompt& a, const CachedPrompt& b) { return a.last_used < b.last_used; });
      total -= lru->bytes;
      cache.erase(lru);
      ++evicted;
    }
    cache.push_back({prompt, tenant, is_public, s.state, bytes, ++cache_clock});
    cache_bytes.store(total);
    cache_entries.store(static_cast<int64_t>(cache.size()));
  }

  // One step of one running sequence: a prefill chunk (and, when that ends
  // the prompt, the first token), a forced token, or one decoded token. A
  // decode step of one new token is not run here: the sequence joins
  // `decode`, whose forward runs once for all of them (DecodeTogether).
  void Advance(Sequence& s, int& prefill_budget, std::vector<TokenEvent>& events, std::vector<Sequence*>& decode) {
    std::vector<float> logits;
    bool have_logits = false;
    const auto& prompt = s.request.prompt;
    if (s.prefilled == 0 && options.prefix_cache_bytes > 0) StartFromCache(s);
    if (s.prefilled < prompt.size()) {
      size_t n = std::min(prompt.size() - s.prefilled, static_cast<size_t>(std::max(prefill_budget, 0)));
      // The chunk stops where the public prefix ends, whose state every tenant may reuse.
      const size_t public_len =
          static_cast<size_t>(std::clamp<int64_t>(s.request.public_prefix_tokens, 0, static_cast<int64_t>(prompt.size()) - 1));
      if (s.prefilled < public_len) n = std::min(n, public_len - s.prefilled);
      if (n == 0) return;
      prefill_budget -= static_cast<int>(n);
      auto st = model->Forward(s.state, std::span<const int>(prompt).subspan(s.prefilled, n), false, &logits);
      if (!st) return events.push_back(Finished(s, FinishReason::kError, "the forward pass failed: " + st.error().message()));
      s.prefilled += n;
      if (s.prefilled == public_len && public_len > 0) KeepInCache(s, public_len, /*is_public=*/true);
      if (s.prefilled < prompt.size()) return;
      KeepInCache(s, prompt.size(), /*is_public=*/false);
      have_logits = true;
    }
    // The thinking budget: an analysis message that reached it ends, and the final answer begins.
    if (s.forced.empty() && s.request.thinking_budget >= 0 && s.channel.InAnalysisBody() &&
        s.usage.reasoning_tokens >= s.request.thinking_budget) {
      s.forced.assign(close_analysis.begin(), close_analysis.end());
    }
    if (!s.forced.empty()) {
      const int token = s.forced.front();
      s.forced.pop_front();
      return events.push_back(Emit(s, token, /*forced=*/true));
    }
    if (!have_logits) {
      if (s.pending.size() == 1) return decode.push_back(&s);
      // Several tokens since the last forward (forced ones): one block.
      auto st = model->Forward(s.state, s.pending, false, &logits);
      if (!st) return events.push_back(Finished(s, FinishReason::kError, "the forward pass failed: " + st.error().message()));
    }
    Sample(s, logits, events);
  }

  // The decode steps of this Step, one forward for all: each weight is read
  // once for the batch, attention runs per sequence.
  void DecodeTogether(const std::vector<Sequence*>& decode, std::vector<TokenEvent>& events) {
    if (decode.empty()) return;
    std::vector<GptOssModel::State*> states;
    std::vector<int> tokens;
    for (Sequence* s : decode) {
      states.push_back(&s->state);
      tokens.push_back(s->pending.front());
    }
    std::vector<float> all;
    auto st = model->ForwardBatch(states, tokens, &all);
    const size_t vocab = static_cast<size_t>(model->config().vocab);
    std::vector<float> logits;
    for (size_t i = 0; i < decode.size(); ++i) {
      Sequence& s = *decode[i];
      if (!st) {
        events.push_back(Finished(s, FinishReason::kError, "the forward pass failed: " + st.error().message()));
        continue;
      }
      logits.assign(all.begin() + static_cast<std::ptrdiff_t>(i * vocab), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
      try {
        Sample(s, logits, events);
      } catch (...) {
        events.push_back(Finished(s, FinishReason::kError, "the step failed: " + ExceptionText(std::current_exception())));
      }
    }
  }

  // Samples the next token from the logits of the last forward and emits it.
  void Sample(Sequence& s, std::vector<float>& logits, std::vector<TokenEvent>& events) {
    s.pending.clear();
    // Only a request that asks for logprobs pays for them: they are read from
    // the raw logits, before the masks below change them (as Engine does).
    std::optional<TokenLogprobs> lp;
    if (s.request.logprobs >= 0) lp.emplace(logits, static_cast<size_t>(tokenizer.vocab_size()));
    // Ids the tokenizer does not define (the embedding's padding rows) are never sampled.
    for (size_t i = static_cast<size_t>(tokenizer.vocab_size()); i < logits.size(); ++i)
      logits[i] = -std::numeric_limits<float>::infinity();
    if (s.request.controller) {
      try {
        s.request.controller->Mask(logits);
      } catch (...) {
        return events.push_back(Finished(s, FinishReason::kError,
                                         "the decode controller failed: " + ExceptionText(std::current_exception())));
      }
    }
    const int token = SampleToken(logits, s.request.sampling, s.rng);
    if (token < 0) return events.push_back(Finished(s, FinishReason::kError, "every token was masked"));
    TokenEvent e = Emit(s, token, /*forced=*/false);
    if (lp) {
      e.logprob = lp->Of(token);
      e.top_logprobs = lp->Top(s.request.logprobs);
    }
    events.push_back(std::move(e));
  }
};

GptOssEngine::GptOssEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GptOssEngine::~GptOssEngine() = default;

Result<std::unique_ptr<GptOssEngine>> GptOssEngine::Create(const std::string& dir, const GptOssEngineOptions& options) {
  MOE_ASSIGN_OR_RETURN(HfTokenizer tokenizer, HfTokenizer::FromFile((std::filesystem::path(dir) / "tokenizer.json").string()));
  auto impl = std::make_unique<Impl>(std::move(tokenizer));
  MOE_ASSIGN_OR_RETURN(impl->harmony, HarmonyTokens::From(impl->tokenizer));
  MOE_ASSIGN_OR_RETURN(impl->model, GptOssModel::Load(dir));
  const GptOssConfig& c = impl->model->config();
  if (impl->tokenizer.vocab_size() > c.vocab)
    return Fail(Error::InvalidArgument("tokenizer.json defines " + std::to_string(impl->tokenizer.vocab_size()) +
                                       " tokens, more than config.json's vocab_size " + std::to_string(c.vocab)));
  if (options.max_running < 1 || options.prefill_chunk_tokens < 1 || options.cache_tokens < 1)
    return Fail(Error::InvalidArgument("gpt-oss engine: max_running, prefill_chunk_tokens and cache_tokens must be positive"));
  impl->options = options;
  impl->max_context = options.max_context > 0 ? std::min(options.max_context, c.max_position) : c.max_position;
  impl->default_stops = HarmonyStopTokens(impl->harmony);
  for (int e : c.eos_tokens)
    if (e >= 0 && e < c.vocab) impl->default_stops.push_back(e);
  const HarmonyTokens& t = impl->harmony;
  MOE_ASSIGN_OR_RETURN(auto assistant, impl->tokenizer.Encode("assistant"));
  MOE_ASSIGN_OR_RETURN(auto final_word, impl->tokenizer.Encode("final"));
  impl->close_analysis = {t.end, t.start};
  impl->close_analysis.insert(impl->close_analysis.end(), assistant.begin(), assistant.end());
  impl->close_analysis.push_back(t.channel);
  impl->close_analysis.insert(impl->close_analysis.end(), final_word.begin(), final_word.end());
  impl->close_analysis.push_back(t.message);
  return std::unique_ptr<GptOssEngine>(new GptOssEngine(std::move(impl)));
}

Result<SequenceId> GptOssEngine::Submit(GenerationRequest request) {
  Impl& m = *impl_;
  if (request.prompt.empty()) return Fail(Error::InvalidArgument("empty prompt"));
  if (request.max_tokens < 1) return Fail(Error::InvalidArgument("max_tokens must be at least 1"));
  if (request.logprobs < -1 || request.logprobs > 20)
    return Fail(Error::InvalidArgument("logprobs must be -1 (off) or 0 to 20 alternatives, got " + std::to_string(request.logprobs)));
  for (int t : request.prompt)
    if (t < 0 || t >= m.model->config().vocab)
      return Fail(Error::InvalidArgument("prompt token " + std::to_string(t) + " is outside the vocabulary"));
  const int64_t need = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (need > m.max_context)
    return Fail(Error::OutOfRange("prompt (" + std::to_string(request.prompt.size()) + " tokens) plus max_tokens (" +
                                  std::to_string(request.max_tokens) + ") exceeds the context window of " +
                                  std::to_string(m.max_context) + " tokens"));
  if (need > m.options.cache_tokens)
    return Fail(Error::OutOfRange("prompt plus max_tokens (" + std::to_string(need) +
                                  " tokens) exceeds cache_tokens (" + std::to_string(m.options.cache_tokens) + ")"));
  std::lock_guard lock(m.mu);
  if (static_cast<int>(m.waiting.size()) >= m.options.max_waiting)
    return Fail(Error::ResourceExhausted("the queue is full (" + std::to_string(m.options.max_waiting) + " waiting)"));
  const SequenceId id = m.next_id++;
  m.waiting.push_back(m.NewSequence(id, std::move(request)));
  return id;
}

void GptOssEngine::Cancel(SequenceId id) {
  std::lock_guard lock(impl_->mu);
  impl_->cancels.insert(id);
}

bool GptOssEngine::HasWork() const {
  std::lock_guard lock(impl_->mu);
  return !impl_->waiting.empty() || !impl_->cancels.empty() || impl_->running_count.load() > 0;
}

std::vector<TokenEvent> GptOssEngine::Step() {
  Impl& m = *impl_;
  std::vector<TokenEvent> events;
  try {
    std::set<SequenceId> cancels;
    {
      std::lock_guard lock(m.mu);
      cancels.swap(m.cancels);
      for (auto it = m.waiting.begin(); it != m.waiting.end();) {
        if (cancels.count((*it)->id)) {
          events.push_back(m.Finished(**it, FinishReason::kCancelled));
          it = m.waiting.erase(it);
        } else {
          ++it;
        }
      }
      // Round-robin across tenants (FairShareOrder); the head of that order
      // waits for room rather than being overtaken.
      {
        std::vector<std::string> tenants;
        for (const auto& w : m.waiting) tenants.push_back(w->request.tenant);
        std::deque<std::unique_ptr<Impl::Sequence>> ordered;
        for (size_t i : FairShareOrder(tenants)) ordered.push_back(std::move(m.waiting[i]));
        m.waiting.swap(ordered);
      }
      while (!m.waiting.empty() && static_cast<int>(m.running.size()) < m.options.max_running &&
             m.reserved.load() + m.waiting.front()->reserved <= m.options.cache_tokens) {
        m.reserved += m.waiting.front()->reserved;
        m.running.push_back(std::move(m.waiting.front()));
        m.waiting.pop_front();
      }
      m.running_count.store(static_cast<int>(m.running.size()));
    }
    int prefill_budget = m.options.prefill_chunk_tokens;
    std::vector<Impl::Sequence*> decode;
    for (auto& s : m.running) {
      if (cancels.count(s->id)) {
        events.push_back(m.Finished(*s, FinishReason::kCancelled));
        continue;
      }
      try {
        m.Advance(*s, prefill_budget, events, decode);
      } catch (...) {
        events.push_back(m.Finished(*s, FinishReason::kError, "the step failed: " + ExceptionText(std::current_exception())));
      }
    }
    m.DecodeTogether(decode, events);
  } catch (...) {
    // Out of memory while admitting or collecting: fail what is running, keep the engine usable.
    for (auto& s : m.running)
      if (!s->done) events.push_back(m.Finished(*s, FinishReason::kError, "the step failed: " + ExceptionText(std::current_exception())));
  }
  for (auto it = m.running.begin(); it != m.running.end();) {
    if ((*it)->done) {
      m.reserved -= (*it)->reserved;
      it = m.running.erase(it);
    } else {
      ++it;
    }
  }
  m.running_count.store(static_cast<int>(m.running.size()));
  return events;
}

EngineMetrics GptOssEngine::Metrics() const {
  EngineMetrics e;
  {
    std::lock_guard lock(impl_->mu);
    e.waiting = static_cast<int>(impl_->waiting.size());
  }
  e.running = impl_->running_count.load();
  e.cache_usage_ratio = static_cast<double>(impl_->reserved.load()) / static_cast<double>(impl_->options.cache_tokens);
  e.prefix_lookup_tokens = impl_->lookup_tokens.load();
  e.prefix_hit_tokens = impl_->hit_tokens.load();
  e.prefix_cache.bytes = e.prefix_cache.state_bytes = impl_->cache_bytes.load();
  e.prefix_cache.limit_bytes = std::max<int64_t>(impl_->options.prefix_cache_bytes, 0);
  e.prefix_cache.entries = impl_->cache_entries.load();
  e.prefix_cache.evicted_for_bytes = impl_->evicted.load();
  e.prefix_cache.too_large = impl_->too_large.load();
  return e;
}

const GptOssConfig& GptOssEngine::config() const { return impl_->model->config(); }
const HfTokenizer& GptOssEngine::tokenizer() const { return impl_->tokenizer; }
const HarmonyTokens& GptOssEngine::harmony_tokens() const { return impl_->harmony; }
int GptOssEngine::max_context() const { return impl_->max_context; }

}  // namespace moeserve::engine

// The moe-dsa-v1 side of server-kept sessions (session_model.hpp): prompts
// as RenderChat makes them, entries counted in bytes and markers, summaries
// starting in the think span and read by OutputAssembler, prompts pinned in
// the engine's prefix cache.
#include "moeserve/daemon/decode_policy.hpp"
#include "moeserve/daemon/session_model.hpp"

namespace moeserve::daemon {

namespace {

class MoeDsa final : public SessionModel {
 public:
  explicit MoeDsa(engine::Engine* engine) : engine_(engine) {}

  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json& tools, const ChatRequest&) const override {
    // Kept images count as the spans they render to (their pixels are not needed to count).
    const engine::VisionConfig* vision = engine_ && engine_->config().vision ? &*engine_->config().vision : nullptr;
    auto p = engine::RenderChatWithImages(messages, tools.is_array() ? &tools : nullptr, true, vision);
    if (!p) return std::nullopt;
    return static_cast<int64_t>(p->tokens.size());
  }

  int64_t EntryTokens(const SessionEntry& entry) const override { return ByteEntryTokens(entry); }

  void PinPrompt(uint64_t key, const std::vector<engine::ChatMessage>& messages, const nlohmann::ordered_json& tools,
                 double seconds) const override {
    if (!engine_) return;
    // A pin holds token ids only, while the cache keys an image's blocks by
    // its hash too: a prompt with images does not render here and is not
    // pinned (its blocks stay cached as any other prefix).
    if (auto prompt = engine::RenderChat(messages, tools.is_array() ? &tools : nullptr, true)) {
      engine_->PinPrefix(key, std::move(*prompt), seconds);
    }
  }

  void Unpin(uint64_t key) const override {
    if (engine_) engine_->PinPrefix(key, {}, 0);
  }

  std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                          int max_tokens, int thinking_budget,
                                                          uint64_t seed) const override {
    auto prompt = engine::RenderChat(messages, nullptr, true);
    if (!prompt) return std::nullopt;
    engine::GenerationRequest g;
    g.prompt = std::move(*prompt);
    g.max_tokens = max_tokens;
    g.thinking_budget = thinking_budget;
    g.starts_in_reasoning = true;
    g.sampling.temperature = 0;
    g.sampling.seed = seed;
    DecodePolicyOptions policy;
    policy.mode = DecodeMode::kNoTools;
    auto controller = DecodePolicy::Create(std::move(policy));
    if (!controller) return std::nullopt;
    g.controller = std::move(*controller);
    return g;
  }

  std::unique_ptr<OutputReader> MakeSummaryReader() const override { return std::make_unique<OutputAssembler>(); }

 private:
  engine::Engine* engine_;
};

}  // namespace

std::shared_ptr<const SessionModel> MoeDsaSessionModel(engine::Engine* engine) {
  return std::make_shared<MoeDsa>(engine);
}

}  // namespace moeserve::daemon

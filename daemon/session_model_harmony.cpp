// The gpt-oss side of server-kept sessions (session_model.hpp): prompts as
// the stateless endpoint renders them (RenderHarmonyRequest), entries counted in the
// family's tokens, summaries rendered at low effort and read by
// HarmonyAssembler (the final channel's text, never analysis). No pins: the
// engine's prefix cache keeps the most recently used prompts' blocks.
#include "moeserve/daemon/harmony_assembler.hpp"
#include "moeserve/daemon/session_model.hpp"

namespace moeserve::daemon {

namespace {

class Harmony final : public SessionModel {
 public:
  Harmony(std::shared_ptr<const HarmonyServing> serving, ReasoningEffort default_effort)
      : serving_(std::move(serving)), default_effort_(default_effort) {
    // The markers around each kind of message (render.cpp's PromptWriter):
    // control tokens count one each, the words between them as encoded.
    user_ = 3 + Words("user");
    developer_ = 3 + Words("developer") + Words("# Instructions\n\n");
    analysis_ = 4 + Words("assistant") + Words("analysis");
    final_ = 4 + Words("assistant") + Words("final");
    // The function's name is not in a result entry (only the call's id): a
    // one-token name stands for it.
    result_ = 4 + Words("functions.tool to=assistant") + Words("commentary");
    call_ = 5 + Words("assistant") + Words("json");
  }

  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json&, const ChatRequest& turn) const override {
    // Rendered as the stateless endpoint renders the turn (its tools as
    // tool_choice offers them, its effort, a named call's header, a response
    // format), so the count is the prompt_tokens the turn will report.
    ChatRequest request = turn;
    request.messages = messages;
    auto p = RenderHarmonyRequest(request, turn.reasoning_effort.value_or(default_effort_), *serving_, engine::GrammarLimits{});
    if (!p) return std::nullopt;
    return static_cast<int64_t>(p->prompt.size());
  }

  int64_t EntryTokens(const SessionEntry& e) const override {
    switch (e.kind) {
      case EntryKind::kText:
        if (e.role == engine::ChatRole::kSystem) return developer_ + Words(e.content);
        if (e.role == engine::ChatRole::kAssistant) return final_ + Words(e.content);
        return user_ + Words(e.content);
      case EntryKind::kReasoning:
        return analysis_ + Words(e.content);
      case EntryKind::kToolCall: {
        // The arguments as the renderer writes them: compact JSON (a string
        // value stands for text that was not JSON, and is written quoted).
        const std::string args = e.arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        return call_ + Words("commentary to=functions." + e.call_name + " ") + Words(args);
      }
      case EntryKind::kToolResult:
        return result_ + Words(e.content);
      case EntryKind::kSummary:
        // Joined to the developer instructions with "\n".
        return 1 + Words(std::string(SummaryHeader()) + e.content);
    }
    return 0;
  }

  std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                          int max_tokens, int thinking_budget,
                                                          uint64_t seed) const override {
    engine::HarmonySystemOptions system;
    system.effort = engine::HarmonyEffort::kLow;
    system.current_date = serving_->current_date;
    auto prompt = engine::RenderHarmonyChat(*serving_->tokenizer, messages, nullptr, system, true);
    if (!prompt) return std::nullopt;
    engine::GenerationRequest g;
    g.prompt = std::move(*prompt);
    g.max_tokens = max_tokens;
    g.thinking_budget = thinking_budget;
    g.starts_in_reasoning = false;  // the model opens its first channel itself
    g.stop_tokens = engine::HarmonyStopTokens(serving_->tokens);
    g.sampling.temperature = 0;
    g.sampling.seed = seed;
    return g;
  }

  std::unique_ptr<OutputReader> MakeSummaryReader() const override {
    HarmonyAssemblerOptions o;
    o.tokenizer = serving_->tokenizer;
    o.tokens = serving_->tokens;
    return std::make_unique<HarmonyAssembler>(std::move(o));
  }

 private:
  // Tokens of plain text as the renderer encodes it (special tokens' text
  // stays text); bytes if it cannot be encoded.
  int64_t Words(const std::string& text) const {
    if (text.empty()) return 0;
    auto ids = serving_->tokenizer->Encode(text, engine::AddedTokenText::kSpecialAsText);
    return ids ? static_cast<int64_t>(ids->size()) : static_cast<int64_t>(text.size());
  }

  std::shared_ptr<const HarmonyServing> serving_;
  ReasoningEffort default_effort_;
  int64_t user_ = 0, developer_ = 0, analysis_ = 0, final_ = 0, result_ = 0, call_ = 0;
};

}  // namespace

std::shared_ptr<const SessionModel> HarmonySessionModel(std::shared_ptr<const HarmonyServing> serving,
                                                        ReasoningEffort default_effort) {
  return std::make_shared<Harmony>(std::move(serving), default_effort);
}

}  // namespace moeserve::daemon

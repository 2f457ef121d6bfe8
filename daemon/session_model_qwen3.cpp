// The Qwen3-Next side of server-kept sessions (session_model.hpp): prompts
// as the stateless endpoint renders them (RenderQwen3Request), entries
// counted in the family's tokens, summaries generated after a reasoning span
// and read by Qwen3Assembler (the answer's text, never reasoning). No pins:
// the engine's prefix cache keeps the most recently used prompts' blocks.
#include "moeserve/daemon/qwen3_assembler.hpp"
#include "moeserve/daemon/session_model.hpp"
#include "moeserve/engine/qwen3_chat.hpp"

namespace moeserve::daemon {

namespace {

class Qwen3 final : public SessionModel {
 public:
  explicit Qwen3(std::shared_ptr<const Qwen3Serving> serving) : serving_(std::move(serving)) {
    // The markers around each kind of entry (engine/qwen3_chat.cpp): marker
    // tokens count one each, the words between them as encoded.
    turn_ = 2 + Words("user\n") + Words("\n");
    reasoning_ = 2 + Words("\n") + Words("\n") + Words("\n\n");
    call_ = 2 + Words("\n{\"name\": \"") + Words("\", \"arguments\": ") + Words("}\n");
    result_ = 2 + Words("\n") + Words("\n") + Words("\n");
  }

  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json&, const ChatRequest& turn) const override {
    ChatRequest request = turn;
    request.messages = messages;
    auto p = RenderQwen3Request(request, *serving_, engine::GrammarLimits{});
    if (!p) return std::nullopt;
    return static_cast<int64_t>(p->prompt.size());
  }

  int64_t EntryTokens(const SessionEntry& e) const override {
    switch (e.kind) {
      case EntryKind::kText:
        return turn_ + Words(e.content);
      case EntryKind::kReasoning:
        return reasoning_ + Words(e.content);
      case EntryKind::kToolCall:
        return call_ + Words(e.call_name) +
               Words(e.arguments.is_string() ? e.arguments.get<std::string>() : engine::PythonJsonDumps(e.arguments));
      case EntryKind::kToolResult:
        return result_ + Words(e.content);
      case EntryKind::kSummary:
        return turn_ + Words(std::string(SummaryHeader()) + e.content);
    }
    return 0;
  }

  std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                          int max_tokens, int thinking_budget,
                                                          uint64_t seed) const override {
    ChatRequest request;
    request.messages = messages;
    request.tool_choice = ToolChoice::kNone;
    auto p = RenderQwen3Request(request, *serving_, engine::GrammarLimits{});
    if (!p) return std::nullopt;
    engine::GenerationRequest g;
    g.prompt = std::move(p->prompt);
    g.controller = std::move(p->controller);
    g.max_tokens = max_tokens;
    g.thinking_budget = thinking_budget;
    g.starts_in_reasoning = true;  // the prompt opened <think>
    g.sampling.temperature = 0;
    g.sampling.seed = seed;
    return g;
  }

  std::unique_ptr<OutputReader> MakeSummaryReader() const override {
    return std::make_unique<Qwen3Assembler>(*serving_, std::vector<std::string>{}, std::nullopt);
  }

 private:
  int64_t Words(const std::string& text) const {
    if (text.empty()) return 0;
    auto ids = serving_->tokenizer->Encode(text, engine::AddedTokenText::kAllAsText);
    return ids ? static_cast<int64_t>(ids->size()) : static_cast<int64_t>(text.size());
  }

  std::shared_ptr<const Qwen3Serving> serving_;
  int64_t turn_ = 0, reasoning_ = 0, call_ = 0, result_ = 0;
};

}  // namespace

std::shared_ptr<const SessionModel> Qwen3SessionModel(std::shared_ptr<const Qwen3Serving> serving) {
  return std::make_shared<Qwen3>(std::move(serving));
}

}  // namespace moeserve::daemon

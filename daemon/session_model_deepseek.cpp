// The DeepSeek-V3.2 side of server-kept sessions (session_model.hpp): prompts
// as the stateless endpoint renders them (RenderDeepseekRequest), entries
// counted in the family's tokens (the markers one each, the DSML markup and
// the words between them as encoded), summaries generated after a reasoning
// span and read by DeepseekAssembler (the answer's text, never reasoning).
// No pins: the engine's prefix cache keeps the most recently used prompts'
// blocks.
#include "moeserve/daemon/deepseek_assembler.hpp"
#include "moeserve/daemon/session_model.hpp"
#include "moeserve/engine/deepseek_chat.hpp"

namespace moeserve::daemon {

namespace {

class Deepseek final : public SessionModel {
 public:
  explicit Deepseek(std::shared_ptr<const DeepseekServing> serving) : serving_(std::move(serving)) {
    // <｜User｜>..<｜Assistant｜></think>, or an answer and its end of sentence.
    turn_ = 3;
    reasoning_ = 1;  // </think>
    call_ = Words("\n\n" + std::string(engine::kDsmlCallsOpen) + "\n" + std::string(engine::kDsmlInvokeOpen)) +
            Words("\">\n\n" + std::string(engine::kDsmlInvokeClose) + "\n" + std::string(engine::kDsmlCallsClose));
    result_ = Words("\n\n<function_results>\n<result>") + Words("</result>\n</function_results>\n\n") + 1;
  }

  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json&, const ChatRequest& turn) const override {
    ChatRequest request = turn;
    request.messages = messages;
    auto p = RenderDeepseekRequest(request, serving_, engine::GrammarLimits{});
    if (!p) return std::nullopt;
    return static_cast<int64_t>(p->prompt.size());
  }

  int64_t EntryTokens(const SessionEntry& e) const override {
    switch (e.kind) {
      case EntryKind::kText:
        return turn_ + Words(e.content);
      case EntryKind::kReasoning:
        return reasoning_ + Words(e.content);
      case EntryKind::kToolCall: {
        int64_t n = call_ + Words(e.call_name);
        if (e.arguments.is_object()) {
          for (auto it = e.arguments.begin(); it != e.arguments.end(); ++it) {
            const bool text = it.value().is_string();
            n += Words("\n" + std::string(engine::kDsmlParameterOpen) + it.key() +
                       (text ? "\" string=\"true\">" : "\" string=\"false\">") +
                       (text ? it.value().get<std::string>() : engine::PythonJsonDumps(it.value())) +
                       std::string(engine::kDsmlParameterClose));
          }
        } else {
          n += Words(e.arguments.is_string() ? e.arguments.get<std::string>() : e.arguments.dump());
        }
        return n;
      }
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
    auto p = RenderDeepseekRequest(request, serving_, engine::GrammarLimits{});
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
    return std::make_unique<DeepseekAssembler>(*serving_, std::vector<std::string>{}, std::nullopt, /*tools=*/false);
  }

 private:
  int64_t Words(const std::string& text) const {
    if (text.empty()) return 0;
    auto ids = serving_->tokenizer->Encode(text, engine::AddedTokenText::kAllAsText);
    return ids ? static_cast<int64_t>(ids->size()) : static_cast<int64_t>(text.size());
  }

  std::shared_ptr<const DeepseekServing> serving_;
  int64_t turn_ = 0, reasoning_ = 0, call_ = 0, result_ = 0;
};

}  // namespace

std::shared_ptr<const SessionModel> DeepseekSessionModel(std::shared_ptr<const DeepseekServing> serving) {
  return std::make_shared<Deepseek>(std::move(serving));
}

}  // namespace moeserve::daemon

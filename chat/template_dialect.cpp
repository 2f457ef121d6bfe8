#include "template_dialect.hpp"

namespace moeserve::chat {

namespace {

class TemplateTurn final : public RenderedTurn {
 public:
  TemplateTurn(const TemplateDialect& dialect, TemplateDialect::TemplatePrompt rendered)
      : dialect_(dialect), controller_(std::move(rendered.controller)), tools_(rendered.tools) {
    prompt = std::move(rendered.prompt);
    starts_in_reasoning = true;  // the prompt opened the reasoning span
  }
  ApiResult<std::shared_ptr<engine::DecodeController>> Controller(uint64_t) override { return std::move(controller_); }
  std::unique_ptr<OutputReader> Reader(std::vector<std::string> stop, uint64_t id_seed) const override {
    return dialect_.MakeReader(std::move(stop), id_seed, tools_);
  }

 private:
  const TemplateDialect& dialect_;
  std::shared_ptr<engine::DecodeController> controller_;
  bool tools_;
};

}  // namespace

Result<std::shared_ptr<const engine::HfTokenizer>> LoadChatTokenizer(const std::string& tokenizer_json,
                                                                     std::string_view family) {
  auto tok = engine::HfTokenizer::FromFile(tokenizer_json);
  if (!tok) return Fail(tok.error().WithContext("serving " + std::string(family) + " chat needs the model's tokenizer.json"));
  return std::make_shared<const engine::HfTokenizer>(std::move(*tok));
}

Result<int> RequiredMarker(const engine::HfTokenizer& tokenizer, std::string_view marker, std::string_view family) {
  auto found = tokenizer.TokenId(marker);
  if (!found)
    return Fail(Error::InvalidArgument("tokenizer.json has no " + std::string(marker) + " token, which " +
                                       std::string(family) + "'s chat format needs"));
  return *found;
}

std::vector<int> PresentMarkers(const engine::HfTokenizer& tokenizer, std::span<const std::string_view> markers) {
  std::vector<int> ids;
  for (std::string_view m : markers)
    if (auto id = tokenizer.TokenId(m)) ids.push_back(*id);
  return ids;
}

ApiResult<std::unique_ptr<RenderedTurn>> TemplateDialect::Render(const ChatRequest& request,
                                                                 const RenderOptions& options) const {
  auto rendered = RenderTemplate(request, options.limits);
  if (!rendered) return ApiFail(rendered.error());
  return std::unique_ptr<RenderedTurn>(std::make_unique<TemplateTurn>(*this, std::move(*rendered)));
}

Result<std::vector<int>> TemplateDialect::PublicPrefix(const std::string& system_prompt) const {
  engine::ChatMessage system{engine::ChatRole::kSystem, system_prompt, std::nullopt, {}, {}};
  MOE_ASSIGN_OR_RETURN(std::vector<engine::ChatPiece> pieces, SystemPieces(system));
  return engine::EncodeChatPieces(*tokenizer_, pieces);
}

std::optional<int64_t> TemplateDialect::PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                                     const nlohmann::ordered_json&, const ChatRequest& turn) const {
  ChatRequest request = turn;
  request.messages = messages;
  auto p = RenderTemplate(request, engine::GrammarLimits{});
  if (!p) return std::nullopt;
  return static_cast<int64_t>(p->prompt.size());
}

std::optional<engine::GenerationRequest> TemplateDialect::SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                                         int max_tokens, int thinking_budget,
                                                                         uint64_t seed) const {
  ChatRequest request;
  request.messages = messages;
  request.tool_choice = ToolChoice::kNone;
  auto p = RenderTemplate(request, engine::GrammarLimits{});
  if (!p) return std::nullopt;
  engine::GenerationRequest g;
  g.prompt = std::move(p->prompt);
  g.controller = std::move(p->controller);
  g.max_tokens = max_tokens;
  g.thinking_budget = thinking_budget;
  g.starts_in_reasoning = true;  // the prompt opened the reasoning span
  g.sampling.temperature = 0;
  g.sampling.seed = seed;
  return g;
}

int64_t TemplateDialect::EntryTokens(const TranscriptEntry& e) const {
  switch (e.kind) {
    case EntryKind::kText:
      return markers_.turn + Words(e.content);
    case EntryKind::kReasoning:
      return markers_.reasoning + Words(e.content);
    case EntryKind::kToolCall: {
      static const nlohmann::ordered_json kNull;
      return markers_.call + Words(e.call_name) + CallArgumentTokens(e.arguments ? *e.arguments : kNull);
    }
    case EntryKind::kToolResult:
      return markers_.result + Words(e.content);
    case EntryKind::kSummary:
      return markers_.turn + Words(std::string(SummaryHeader()).append(e.content));
  }
  return 0;
}

int64_t TemplateDialect::Words(std::string_view text) const {
  if (text.empty()) return 0;
  auto ids = tokenizer_->Encode(text, engine::AddedTokenText::kAllAsText);
  return ids ? static_cast<int64_t>(ids->size()) : static_cast<int64_t>(text.size());
}

}  // namespace moeserve::chat

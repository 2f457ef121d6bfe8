// gpt-oss's chat dialect: requests rendered in harmony
// (RenderHarmonyRequest: the tier's effort in the system message, the call
// header tool_choice demands at the prompt's end), output read by harmony's
// parser (HarmonyAssembler). A demanded call's arguments follow its schema
// (HarmonyArgumentsController); when the model chooses (tools under auto, or
// a response_format), the whole output follows harmony's structure
// (HarmonyStructureController). In sessions: prompts as the stateless
// endpoint renders them, entries counted in the family's tokens, summaries
// rendered at low effort and read as the final channel's text, never
// analysis. No pins: the engine's prefix cache keeps the most recently used
// prompts' blocks.
#include "moeserve/chat/gpt_oss/gpt_oss_dialect.hpp"

#include <algorithm>

#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/chat/gpt_oss/harmony_assembler.hpp"
#include "moeserve/chat/gpt_oss/harmony_request.hpp"
#include "moeserve/chat/gpt_oss/harmony_structure.hpp"

namespace moeserve::chat {

namespace {

class HarmonyTurn final : public RenderedTurn {
 public:
  HarmonyTurn(std::shared_ptr<const HarmonyServing> serving, HarmonyPrompt rendered, const ChatRequest& req,
              const engine::GrammarLimits& limits)
      : serving_(std::move(serving)), rendered_(std::move(rendered)), limits_(limits), tool_specs_(req.tool_specs),
        json_object_(req.json_object), response_schema_(req.response_schema),
        response_schema_strict_(req.response_schema_strict) {
    prompt = std::move(rendered_.prompt);
    starts_in_reasoning = false;  // the model opens its first channel itself
    stop_tokens = engine::HarmonyStopTokens(serving_->tokens);
  }

  ApiResult<std::shared_ptr<engine::DecodeController>> Controller(uint64_t) override {
    const HarmonyServing& h = *serving_;
    if (!h.token_bytes) return std::shared_ptr<engine::DecodeController>();
    if (rendered_.opened_call || !rendered_.call_choices.empty()) {
      // The call tool_choice demands: its arguments follow the function's schema, then <|call|>.
      std::vector<HarmonyArgumentsController::Choice> choices;
      for (const ToolSpec& t : rendered_.opened_call ? std::vector<ToolSpec>{*rendered_.opened_call} : rendered_.call_choices) {
        auto grammar = engine::JsonGrammar::ForObjectSchema(t.parameters, limits_, t.strict);
        if (!grammar) {
          return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                                  "tools[" + std::to_string(t.index) + "].function.parameters"));
        }
        choices.push_back({t.name, std::move(*grammar)});
      }
      if (rendered_.opened_call)
        return std::shared_ptr<engine::DecodeController>(
            std::make_shared<HarmonyArgumentsController>(h.token_bytes, std::move(choices[0].grammar), h.tokens.call));
      return std::shared_ptr<engine::DecodeController>(std::make_shared<HarmonyArgumentsController>(
          h.token_bytes, std::move(choices), rendered_.header_tail, h.tokens.call));
    }
    if (!json_object_ && rendered_.tool_names.empty()) return std::shared_ptr<engine::DecodeController>();
    HarmonyStructureOptions structure;
    structure.index = h.token_bytes;
    structure.tokens = h.tokens;
    for (const ToolSpec& t : tool_specs_) {
      const auto& names = rendered_.tool_names;
      if (std::find(names.begin(), names.end(), t.name) == names.end()) continue;
      auto grammar = engine::JsonGrammar::ForObjectSchema(t.parameters, limits_, t.strict);
      if (!grammar) {
        return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                                "tools[" + std::to_string(t.index) + "].function.parameters"));
      }
      structure.functions.push_back({t.name, std::move(*grammar)});
    }
    if (json_object_) {
      const nlohmann::ordered_json schema =
          response_schema_.is_object() ? response_schema_ : nlohmann::ordered_json{{"type", "object"}};
      auto grammar = engine::JsonGrammar::ForObjectSchema(schema, limits_, response_schema_strict_);
      if (!grammar) {
        return ApiFail(ApiError::InvalidRequest(grammar.error().message(), "response_format.json_schema.schema"));
      }
      structure.response = std::move(*grammar);
    }
    return std::shared_ptr<engine::DecodeController>(std::make_shared<HarmonyStructureController>(std::move(structure)));
  }

  std::unique_ptr<OutputReader> Reader(std::vector<std::string> stop, uint64_t id_seed) const override {
    return std::make_unique<HarmonyAssembler>(HarmonyAssemblerOptions{
        serving_->tokenizer, serving_->tokens, rendered_.tool_names, std::move(stop), id_seed, rendered_.prefill});
  }

 private:
  std::shared_ptr<const HarmonyServing> serving_;
  HarmonyPrompt rendered_;  // its prompt moved out; the rest read by Controller and Reader
  engine::GrammarLimits limits_;
  std::vector<ToolSpec> tool_specs_;
  bool json_object_;
  nlohmann::ordered_json response_schema_;
  bool response_schema_strict_;
};

class GptOssDialect final : public ChatDialect {
 public:
  GptOssDialect(std::shared_ptr<const HarmonyServing> serving, ReasoningEffort default_effort)
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

  std::string family() const override { return "gpt-oss"; }

  ApiResult<std::unique_ptr<RenderedTurn>> Render(const ChatRequest& req, const RenderOptions& options) const override {
    // The tier's effort goes into the system message.
    auto h = RenderHarmonyRequest(req, options.effort, *serving_, options.limits);
    if (!h) return ApiFail(h.error());
    return std::unique_ptr<RenderedTurn>(std::make_unique<HarmonyTurn>(serving_, std::move(*h), req, options.limits));
  }

  // Nothing is shared across tenants: harmony's system message carries the
  // request's effort (and the date), so no configured prefix is common to
  // every prompt.
  Result<std::vector<int>> PublicPrefix(const std::string&) const override { return std::vector<int>{}; }

  const engine::HfTokenizer* logprobs_tokenizer() const override { return serving_->tokenizer; }

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

  int64_t EntryTokens(const TranscriptEntry& e) const override {
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
        static const nlohmann::ordered_json kNull;
        const std::string args = (e.arguments ? *e.arguments : kNull)
                                     .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        return call_ + Words("commentary to=functions." + std::string(e.call_name) + " ") + Words(args);
      }
      case EntryKind::kToolResult:
        return result_ + Words(e.content);
      case EntryKind::kSummary:
        // Joined to the developer instructions with "\n".
        return 1 + Words(std::string(SummaryHeader()).append(e.content));
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
  int64_t Words(std::string_view text) const {
    if (text.empty()) return 0;
    auto ids = serving_->tokenizer->Encode(text, engine::AddedTokenText::kSpecialAsText);
    return ids ? static_cast<int64_t>(ids->size()) : static_cast<int64_t>(text.size());
  }

  std::shared_ptr<const HarmonyServing> serving_;
  ReasoningEffort default_effort_;
  int64_t user_ = 0, developer_ = 0, analysis_ = 0, final_ = 0, result_ = 0, call_ = 0;
};

}  // namespace

Result<std::shared_ptr<const ChatDialect>> LoadGptOssDialect(const DialectInputs& inputs) {
  // The engine's tokenizer (the family's chat hooks hold it): the dialect
  // renders and reads with the ids the engine samples.
  const engine::HfTokenizer* tokenizer = inputs.engine ? inputs.engine->chat().chat_tokenizer() : nullptr;
  if (!tokenizer) return Fail(Error::InvalidArgument("gpt-oss chat needs the engine's harmony tokenizer"));
  auto serving = std::make_shared<HarmonyServing>();
  serving->tokenizer = tokenizer;
  MOE_ASSIGN_OR_RETURN(serving->tokens, engine::HarmonyTokens::From(*tokenizer));
  serving->token_bytes = TokenByteIndex::Build(*tokenizer);
  return MakeGptOssDialect(std::move(serving), inputs.default_effort);
}

std::shared_ptr<const ChatDialect> MakeGptOssDialect(std::shared_ptr<const HarmonyServing> serving,
                                                     ReasoningEffort default_effort) {
  return std::make_shared<GptOssDialect>(std::move(serving), default_effort);
}

}  // namespace moeserve::chat

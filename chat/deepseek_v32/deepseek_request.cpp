#include "moeserve/chat/deepseek_v32/deepseek_request.hpp"

#include <algorithm>
#include <limits>

#include "moeserve/chat/qwen3_next/qwen3_request.hpp"
#include "moeserve/engine/deepseek_chat.hpp"
#include "../template_dialect.hpp"

namespace moeserve::chat {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kCallHead = "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"";
constexpr std::string_view kCallTail = "\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

std::string ParameterOpen(const DsmlCallController::Parameter& p) {
  return std::string(engine::kDsmlParameterOpen) + p.name + (p.is_string ? "\" string=\"true\">" : "\" string=\"false\">");
}

bool IsPrefixOf(std::string_view bytes, std::string_view whole) {
  return !bytes.empty() && bytes.size() <= whole.size() && whole.substr(0, bytes.size()) == bytes;
}

// Plain text of a string parameter: no byte that would need escaping in
// JSON, and no '<' (which ends the value).
bool PlainValueText(std::string_view bytes) {
  for (unsigned char c : bytes)
    if (c < 0x20 || c == '"' || c == '\\' || c == '<') return false;
  return true;
}

// One required parameter: its grammar reads {"name": value} and is fed up
// to the value.
ApiResult<DsmlCallController::Parameter> MakeParameter(const ToolSpec& spec, const std::string& name,
                                                      const ordered_json& schema, const engine::GrammarLimits& limits) {
  const bool is_string = schema.is_object() && schema.contains("type") && schema["type"] == "string";
  ordered_json wrapper = {{"type", "object"},
                          {"properties", {{name, schema}}},
                          {"required", ordered_json::array({name})},
                          {"additionalProperties", false}};
  for (const char* defs : {"$defs", "definitions"})
    if (spec.parameters.contains(defs)) wrapper[defs] = spec.parameters[defs];
  const std::string field = "tools[" + std::to_string(spec.index) + "].function.parameters";
  auto grammar = engine::JsonGrammar::ForObjectSchema(wrapper, limits, spec.strict);
  if (!grammar) return ApiFail(ApiError::InvalidRequest(grammar.error().message(), field));
  const std::string head = "{" + ordered_json(name).dump() + ":" + (is_string ? "\"" : "");
  for (unsigned char c : head)
    if (!grammar->Feed(c))
      return ApiFail(ApiError::InvalidRequest("parameter '" + name + "' cannot be written by the schema", field));
  return DsmlCallController::Parameter{name, is_string, std::move(*grammar)};
}

}  // namespace

Result<DeepseekTokens> DeepseekTokens::From(const engine::HfTokenizer& tokenizer) {
  constexpr std::string_view kFamily = "DeepSeek-V3.2";
  DeepseekTokens t;
  MOE_ASSIGN_OR_RETURN(t.bos, RequiredMarker(tokenizer, "<｜begin▁of▁sentence｜>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.eos, RequiredMarker(tokenizer, "<｜end▁of▁sentence｜>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.user, RequiredMarker(tokenizer, "<｜User｜>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.assistant, RequiredMarker(tokenizer, "<｜Assistant｜>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.think, RequiredMarker(tokenizer, "<think>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.end_think, RequiredMarker(tokenizer, "</think>", kFamily));
  return t;
}

Result<std::shared_ptr<const DeepseekServing>> DeepseekServing::Load(const std::string& tokenizer_json) {
  auto serving = std::make_shared<DeepseekServing>();
  MOE_ASSIGN_OR_RETURN(serving->tokenizer, LoadChatTokenizer(tokenizer_json, "DeepSeek-V3.2"));
  MOE_ASSIGN_OR_RETURN(serving->tokens, DeepseekTokens::From(*serving->tokenizer));
  // The non-special added tokens mean structure when emitted: never text in a constrained value.
  static constexpr std::string_view kStructure[] = {
      "<think>", "</think>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
      "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
      "<｜tool▁sep｜>"};
  serving->token_bytes = TokenByteIndex::Build(*serving->tokenizer, PresentMarkers(*serving->tokenizer, kStructure));
  return std::shared_ptr<const DeepseekServing>(std::move(serving));
}

ApiResult<DeepseekPrompt> RenderDeepseekRequest(const ChatRequest& req,
                                                const std::shared_ptr<const DeepseekServing>& shared,
                                                const engine::GrammarLimits& limits) {
  const DeepseekServing& serving = *shared;
  const bool none = req.tool_choice == ToolChoice::kNone;
  engine::DeepseekChatOptions options;
  options.thinking = true;
  options.tools = !none && req.tools.is_array() && !req.tools.empty() ? &req.tools : nullptr;
  options.response_format = req.json_object && req.response_format.is_object() ? &req.response_format : nullptr;
  auto pieces = engine::RenderDeepseekChat(req.messages, options);
  if (!pieces) {
    const std::string& field = pieces.error().field();
    return ApiFail(ApiError::InvalidRequest(pieces.error().message(), field.empty() ? "messages" : field));
  }
  const engine::HfTokenizer& tok = *serving.tokenizer;
  auto ids = engine::EncodeChatPieces(tok, *pieces);
  if (!ids) return ApiFail(ApiError::InvalidRequest(ids.error().message(), "messages"));
  DeepseekPrompt p;
  p.prompt = std::move(*ids);
  p.tools = options.tools != nullptr;
  const DeepseekTokens& t = serving.tokens;

  if (req.tool_choice == ToolChoice::kRequired || req.tool_choice == ToolChoice::kNamed) {
    std::vector<DsmlCallController::Choice> choices;
    for (const ToolSpec& s : req.tool_specs) {
      if (req.tool_choice == ToolChoice::kNamed && s.name != req.tool_choice_name) continue;
      // The whole schema must be one the grammar can hold, as for the other families.
      if (auto whole = engine::JsonGrammar::ForObjectSchema(s.parameters, limits, s.strict); !whole) {
        return ApiFail(ApiError::InvalidRequest(whole.error().message(),
                                                "tools[" + std::to_string(s.index) + "].function.parameters"));
      }
      DsmlCallController::Choice choice;
      choice.name = s.name;
      const ordered_json* props = s.parameters.contains("properties") && s.parameters["properties"].is_object()
                                      ? &s.parameters["properties"]
                                      : nullptr;
      if (props != nullptr && s.parameters.contains("required") && s.parameters["required"].is_array()) {
        for (auto it = props->begin(); it != props->end(); ++it) {
          const auto& required = s.parameters["required"];
          if (std::find(required.begin(), required.end(), ordered_json(it.key())) == required.end()) continue;
          auto parameter = MakeParameter(s, it.key(), it.value(), limits);
          if (!parameter) return ApiFail(parameter.error());
          choice.parameters.push_back(std::move(*parameter));
        }
      }
      choices.push_back(std::move(choice));
    }
    if (choices.empty())
      return ApiFail(ApiError::InvalidRequest("tool_choice names a function that is not in tools", "tool_choice"));
    p.controller = std::make_shared<DsmlCallController>(shared, std::move(choices));
  } else if (req.json_object) {
    const ordered_json schema = req.response_schema.is_object() ? req.response_schema : ordered_json{{"type", "object"}};
    auto grammar = engine::JsonGrammar::ForObjectSchema(schema, limits, req.response_schema_strict);
    if (!grammar) return ApiFail(ApiError::InvalidRequest(grammar.error().message(), "response_format.json_schema.schema"));
    // The answer follows </think> directly (the encoding writes no separator).
    p.controller = std::make_shared<Qwen3ConstrainedController>(
        serving.token_bytes, t.end_think, std::vector<int>{t.eos}, std::vector<int>{},
        std::vector<Qwen3ConstrainedController::Choice>{}, std::vector<int>{}, std::move(*grammar),
        std::vector<int>{t.eos});
  }
  return p;
}

DsmlCallController::DsmlCallController(std::shared_ptr<const DeepseekServing> serving, std::vector<Choice> choices)
    : serving_(std::move(serving)), choices_(std::move(choices)) {
  for (const auto& e : serving_->token_bytes->entries())
    if (IsPrefixOf(e.bytes, engine::kDsmlParameterClose)) closers_.push_back(e.id);
}

std::vector<int> DsmlCallController::Force(const std::string& text, bool end) {
  auto ids = serving_->tokenizer->Encode(text, engine::AddedTokenText::kAllAsText);
  std::vector<int> out = ids ? std::move(*ids) : std::vector<int>{};
  if (end) out.push_back(serving_->tokens.eos);
  skip_ = out.size();
  return out;
}

std::vector<int> DsmlCallController::Next(std::string lead) {
  if (parameter_ < chosen_->parameters.size()) {
    const Parameter& p = chosen_->parameters[parameter_];
    if (parameter_ > 0) lead += "\n";
    lead += ParameterOpen(p);
    value_ = p.grammar;
    phase_ = Phase::kValue;
    return Force(lead);
  }
  phase_ = Phase::kDone;
  return Force(lead + std::string(kCallTail), /*end=*/true);
}

bool DsmlCallController::ValueMayEnd() const {
  return value_ && value_->CanAccept(chosen_->parameters[parameter_].is_string ? '"' : '}');
}

void DsmlCallController::Mask(std::span<float> logits) {
  if (broken_) return;
  const int vocab = static_cast<int>(logits.size());
  if (phase_ == Phase::kReasoning) {
    const int eos = serving_->tokens.eos;
    if (eos >= 0 && eos < vocab) logits[static_cast<size_t>(eos)] = -std::numeric_limits<float>::infinity();
  } else if (phase_ == Phase::kName) {
    // Tokens that keep what was written a prefix of some `name"`.
    std::vector<std::string> targets;
    for (const Choice& c : choices_) targets.push_back(c.name + "\"");
    MaskAllBut(logits, TokensContinuingOneOf(*serving_->token_bytes, name_written_, targets, vocab));
  } else if (phase_ == Phase::kValue) {
    const bool is_string = chosen_->parameters[parameter_].is_string;
    std::vector<int> allowed;
    for (int id : TokensAcceptedBy(*serving_->token_bytes, *value_, vocab)) {
      const std::string& bytes = serving_->token_bytes->BytesOf(id);
      if (is_string) {
        if (!PlainValueText(bytes)) continue;
      } else if (bytes.find('}') != std::string::npos) {
        // Never the brace that closes the {"name": value} wrapper: it is not DSML text.
        engine::JsonGrammar probe = *value_;
        if (!FeedTokenBytes(probe, bytes) || probe.Done()) continue;
      }
      allowed.push_back(id);
    }
    if (ValueMayEnd())
      for (int id : closers_)
        if (id < vocab) allowed.push_back(id);
    MaskAllBut(logits, allowed);
  }
}

std::vector<int> DsmlCallController::OnToken(int token) {
  if (broken_) return {};
  if (skip_ > 0) {
    --skip_;
    return {};
  }
  switch (phase_) {
    case Phase::kReasoning: {
      if (token != serving_->tokens.end_think) return {};
      if (choices_.size() == 1) {
        chosen_ = &choices_[0];
        return Next(std::string(kCallHead) + chosen_->name + "\">\n");
      }
      phase_ = Phase::kName;
      return Force(std::string(kCallHead));
    }
    case Phase::kName: {
      name_written_ += serving_->token_bytes->BytesOf(token);
      for (const Choice& c : choices_) {
        if (name_written_ == c.name + "\"") {
          chosen_ = &c;
          return Next(">\n");
        }
      }
      return {};
    }
    case Phase::kValue: {
      const std::string& bytes = serving_->token_bytes->BytesOf(token);
      if (ValueMayEnd() && IsPrefixOf(bytes, engine::kDsmlParameterClose)) {
        ++parameter_;
        value_.reset();
        return Next(std::string(engine::kDsmlParameterClose.substr(bytes.size())));
      }
      if (bytes.empty() || !FeedTokenBytes(*value_, bytes)) broken_ = true;
      return {};
    }
    case Phase::kDone:
      return {};
  }
  return {};
}

}  // namespace moeserve::chat

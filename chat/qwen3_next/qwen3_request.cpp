#include "moeserve/chat/qwen3_next/qwen3_request.hpp"

#include <algorithm>
#include <limits>

#include "moeserve/engine/qwen3_chat.hpp"
#include "../template_dialect.hpp"

namespace moeserve::chat {

namespace {

using ordered_json = nlohmann::ordered_json;

std::vector<int> Text(const engine::HfTokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text, engine::AddedTokenText::kAllAsText);
  return ids ? std::move(*ids) : std::vector<int>{};
}

std::vector<int> Join(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

Result<Qwen3Tokens> Qwen3Tokens::From(const engine::HfTokenizer& tokenizer) {
  constexpr std::string_view kFamily = "Qwen3";
  Qwen3Tokens t;
  MOE_ASSIGN_OR_RETURN(t.im_end, RequiredMarker(tokenizer, "<|im_end|>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.think, RequiredMarker(tokenizer, "<think>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.end_think, RequiredMarker(tokenizer, "</think>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.tool_call, RequiredMarker(tokenizer, "<tool_call>", kFamily));
  MOE_ASSIGN_OR_RETURN(t.end_tool_call, RequiredMarker(tokenizer, "</tool_call>", kFamily));
  if (auto eot = tokenizer.TokenId("<|endoftext|>")) t.endoftext = *eot;
  return t;
}

Result<std::shared_ptr<const Qwen3Serving>> Qwen3Serving::Load(const std::string& tokenizer_json) {
  auto serving = std::make_shared<Qwen3Serving>();
  MOE_ASSIGN_OR_RETURN(serving->tokenizer, LoadChatTokenizer(tokenizer_json, "Qwen3-Next"));
  MOE_ASSIGN_OR_RETURN(serving->tokens, Qwen3Tokens::From(*serving->tokenizer));
  // Qwen3's non-special added tokens mean structure when emitted: never text in a constrained value.
  static constexpr std::string_view kStructure[] = {
      "<think>",       "</think>",      "<tool_call>",   "</tool_call>", "<tool_response>", "</tool_response>",
      "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",  "<|repo_name|>",  "<|file_sep|>"};
  serving->token_bytes = TokenByteIndex::Build(*serving->tokenizer, PresentMarkers(*serving->tokenizer, kStructure));
  return std::shared_ptr<const Qwen3Serving>(std::move(serving));
}

ApiResult<Qwen3Prompt> RenderQwen3Request(const ChatRequest& req, const Qwen3Serving& serving,
                                          const engine::GrammarLimits& limits) {
  const bool none = req.tool_choice == ToolChoice::kNone;
  const ordered_json* tools = !none && req.tools.is_array() && !req.tools.empty() ? &req.tools : nullptr;
  auto pieces = engine::RenderQwen3Chat(req.messages, tools, /*add_generation_prompt=*/true);
  if (!pieces) {
    const std::string& field = pieces.error().field();
    return ApiFail(ApiError::InvalidRequest(pieces.error().message(), field.empty() ? "messages" : field));
  }
  const engine::HfTokenizer& tok = *serving.tokenizer;
  auto ids = engine::EncodeChatPieces(tok, *pieces);
  if (!ids) return ApiFail(ApiError::InvalidRequest(ids.error().message(), "messages"));
  Qwen3Prompt p;
  p.prompt = std::move(*ids);
  const Qwen3Tokens& t = serving.tokens;
  std::vector<int> masked = {t.im_end, t.tool_call, t.end_tool_call};
  if (t.endoftext >= 0) masked.push_back(t.endoftext);

  if (req.tool_choice == ToolChoice::kRequired || req.tool_choice == ToolChoice::kNamed) {
    std::vector<Qwen3ConstrainedController::Choice> choices;
    for (const ToolSpec& s : req.tool_specs) {
      if (req.tool_choice == ToolChoice::kNamed && s.name != req.tool_choice_name) continue;
      auto grammar = engine::JsonGrammar::ForObjectSchema(s.parameters, limits, s.strict);
      if (!grammar) {
        return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                                "tools[" + std::to_string(s.index) + "].function.parameters"));
      }
      choices.push_back({s.name, std::move(*grammar)});
    }
    if (choices.empty())
      return ApiFail(ApiError::InvalidRequest("tool_choice names a function that is not in tools", "tool_choice"));
    std::vector<int> prefix = Join(Join(Text(tok, "\n\n"), {t.tool_call}), Text(tok, "\n{\"name\": \""));
    std::vector<int> after_name = Text(tok, ", \"arguments\": ");  // the model wrote the name's closing quote
    if (choices.size() == 1) {
      // The whole head as one piece, as the template's text tokenizes.
      prefix = Join(Join(Text(tok, "\n\n"), {t.tool_call}),
                    Text(tok, "\n{\"name\": \"" + choices[0].name + "\", \"arguments\": "));
      after_name.clear();
    }
    std::vector<int> suffix = Join(Join(Text(tok, "}\n"), {t.end_tool_call}), {t.im_end});
    p.controller = std::make_shared<Qwen3ConstrainedController>(serving.token_bytes, t.end_think, std::move(masked),
                                                                std::move(prefix), std::move(choices),
                                                                std::move(after_name), std::nullopt, std::move(suffix));
  } else if (req.json_object) {
    const ordered_json schema = req.response_schema.is_object() ? req.response_schema : ordered_json{{"type", "object"}};
    auto grammar = engine::JsonGrammar::ForObjectSchema(schema, limits, req.response_schema_strict);
    if (!grammar) return ApiFail(ApiError::InvalidRequest(grammar.error().message(), "response_format.json_schema.schema"));
    p.controller = std::make_shared<Qwen3ConstrainedController>(
        serving.token_bytes, t.end_think, std::move(masked), Text(tok, "\n\n"),
        std::vector<Qwen3ConstrainedController::Choice>{}, std::vector<int>{}, std::move(*grammar),
        std::vector<int>{t.im_end});
  } else if (tools == nullptr) {
    p.controller = std::make_shared<MaskIdsController>(std::vector<int>{t.tool_call, t.end_tool_call});
  }
  return p;
}

Qwen3ConstrainedController::Qwen3ConstrainedController(std::shared_ptr<const TokenByteIndex> index, int end_think,
                                                       std::vector<int> masked, std::vector<int> prefix,
                                                       std::vector<Choice> choices, std::vector<int> after_name,
                                                       std::optional<engine::JsonGrammar> value, std::vector<int> suffix)
    : index_(std::move(index)),
      end_think_(end_think),
      masked_(std::move(masked)),
      prefix_(std::move(prefix)),
      after_name_(std::move(after_name)),
      suffix_(std::move(suffix)),
      choices_(std::move(choices)),
      grammar_(std::move(value)) {}

std::vector<int> Qwen3ConstrainedController::Force(std::vector<int> ids) {
  skip_ = ids.size();
  return ids;
}

void Qwen3ConstrainedController::Mask(std::span<float> logits) {
  if (broken_) return;
  if (phase_ == Phase::kReasoning) {
    for (int id : masked_)
      if (id >= 0 && static_cast<size_t>(id) < logits.size())
        logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  } else if (phase_ == Phase::kName) {
    // Tokens that keep what was written a prefix of some `name"`.
    std::vector<std::string> targets;
    for (const Choice& c : choices_) targets.push_back(c.name + "\"");
    MaskAllBut(logits, TokensContinuingOneOf(*index_, name_written_, targets, static_cast<int>(logits.size())));
  } else if (phase_ == Phase::kValue) {
    MaskAllBut(logits, TokensAcceptedBy(*index_, *grammar_, static_cast<int>(logits.size())));
  }
}

std::vector<int> Qwen3ConstrainedController::OnToken(int token) {
  if (broken_) return {};
  if (skip_ > 0) {
    --skip_;
    return {};
  }
  switch (phase_) {
    case Phase::kReasoning: {
      if (token != end_think_) return {};
      if (choices_.size() == 1) {
        grammar_ = choices_[0].grammar;
        phase_ = Phase::kValue;
      } else {
        phase_ = choices_.empty() ? Phase::kValue : Phase::kName;
      }
      return Force(prefix_);
    }
    case Phase::kName: {
      name_written_ += index_->BytesOf(token);
      for (const Choice& c : choices_) {
        if (name_written_ == c.name + "\"") {
          grammar_ = c.grammar;
          phase_ = Phase::kValue;
          return Force(after_name_);
        }
      }
      return {};
    }
    case Phase::kValue: {
      const std::string& bytes = index_->BytesOf(token);
      if (bytes.empty() || !FeedTokenBytes(*grammar_, bytes)) {
        broken_ = true;
        return {};
      }
      if (!grammar_->Done()) return {};
      phase_ = Phase::kSuffix;
      return Force(suffix_);
    }
    case Phase::kSuffix:
      return {};
  }
  return {};
}

void MaskIdsController::Mask(std::span<float> logits) {
  for (int id : ids_)
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
}

}  // namespace moeserve::chat

// A chat request as a Qwen3-Next prompt (engine/qwen3_chat.hpp renders the
// published template) and the decode controller its tool_choice or
// response_format needs (docs/http-api.md, Qwen3-Next):
//
//   tool_choice auto      tools in the system prompt; the model may call any
//   tool_choice none      no tools rendered; <tool_call> is masked
//   required, or named    after the reasoning span the server writes
//                         "\n\n<tool_call>\n{\"name\": \"" as the template does; the
//                         model writes one of the tools' names (the server the
//                         whole name when only one may be called), the server
//                         `", "arguments": `, the model the arguments constrained
//                         by the function's schema (engine::JsonGrammar, compact), and
//                         the server "}\n</tool_call>" and <|im_end|>: one call
//   response_format       after the reasoning span the server writes "\n\n"; the
//                         answer is one JSON object of the schema, then <|im_end|>
// Reasoning stays free in every mode (the thinking budget closes it); while a
// call or an answer object is demanded, the stop tokens and the call
// markers are masked inside it so that it cannot end before the call.
//
// Thread safety: RenderQwen3Request is a function over values; a controller
// runs on the engine's Step() thread only.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "moeserve/chat/api_error.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::chat {

// The ids of the format's markers in the served tokenizer.
struct Qwen3Tokens {
  int im_end = -1, endoftext = -1, think = -1, end_think = -1, tool_call = -1, end_tool_call = -1;
  static Result<Qwen3Tokens> From(const engine::HfTokenizer& tokenizer);
};

// What the daemon serving a Qwen3-Next model renders and reads with.
struct Qwen3Serving {
  std::shared_ptr<const engine::HfTokenizer> tokenizer;
  Qwen3Tokens tokens;
  // The text tokens by their bytes, the markers left out (constrained output).
  std::shared_ptr<const TokenByteIndex> token_bytes;
  static Result<std::shared_ptr<const Qwen3Serving>> Load(const std::string& tokenizer_json);
};

struct Qwen3Prompt {
  std::vector<int> prompt;  // ends with <|im_start|>assistant\n<think>\n
  std::shared_ptr<engine::DecodeController> controller;  // null: the output is free
};

ApiResult<Qwen3Prompt> RenderQwen3Request(const ChatRequest& request, const Qwen3Serving& serving,
                                          const engine::GrammarLimits& limits);

// After the reasoning span, the server writes `prefix`; with `choices`, the
// model writes one choice's name and '"' (the server writes it when there is
// one choice), the server `after_name`; then the model writes one JSON value
// of the choice's grammar (or of `value` without choices), and the server
// `suffix` (ending with a stop). Before that, `masked` (stops and markers)
// are never sampled.
class Qwen3ConstrainedController : public engine::DecodeController {
 public:
  struct Choice {
    std::string name;
    engine::JsonGrammar grammar;  // the function's parameters
  };
  Qwen3ConstrainedController(std::shared_ptr<const TokenByteIndex> index, int end_think, std::vector<int> masked,
                             std::vector<int> prefix, std::vector<Choice> choices, std::vector<int> after_name,
                             std::optional<engine::JsonGrammar> value, std::vector<int> suffix);
  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

 private:
  enum class Phase { kReasoning, kName, kValue, kSuffix };
  std::vector<int> Force(std::vector<int> ids);
  std::shared_ptr<const TokenByteIndex> index_;
  int end_think_;
  std::vector<int> masked_, prefix_, after_name_, suffix_;
  std::vector<Choice> choices_;
  std::string name_written_;
  std::optional<engine::JsonGrammar> grammar_;
  Phase phase_ = Phase::kReasoning;
  size_t skip_ = 0;      // forced tokens still to come back through OnToken
  bool broken_ = false;  // a refused token was emitted anyway (forced by the engine): no more constraint
};

// Masks fixed ids everywhere (tool_choice none: the call marker).
class MaskIdsController : public engine::DecodeController {
 public:
  explicit MaskIdsController(std::vector<int> ids) : ids_(std::move(ids)) {}
  void Mask(std::span<float> logits) override;

 private:
  std::vector<int> ids_;
};

}  // namespace moeserve::chat

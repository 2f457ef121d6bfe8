// A chat request as a DeepSeek-V3.2 prompt (engine/deepseek_chat.hpp renders
// the published encoding, in thinking mode: the prompt ends with <think>)
// and the decode controller its tool_choice or response_format needs
// (docs/http-api.md, DeepSeek-V3.2):
//
//   tool_choice auto      tools in the system prompt; the model may call any
//                         (a DSML function_calls block after the reasoning)
//   tool_choice none      no tools rendered; DSML the model writes stays text
//   required, or named    after the reasoning span the server writes
//                         "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\""; the model
//                         writes one of the tools' names (the server the whole
//                         name when only one may be called), then for each
//                         required parameter of the function's schema, in the
//                         schema's order, the server writes its opening tag and
//                         the model its value: a string parameter (string="true")
//                         as plain text its schema accepts (no quotes, backslashes,
//                         '<' or control characters), any other as compact JSON of
//                         its schema (engine::JsonGrammar); the model ends a value with '<',
//                         the server completes the closing tag, and finally writes
//                         "\n</｜DSML｜invoke>\n</｜DSML｜function_calls>" and the end
//                         of sentence: one call
//   response_format       the rendering adds the schema to the system prompt;
//                         after the reasoning span the answer is one JSON object
//                         of the schema, then the end of sentence
// Reasoning stays free in every mode (the tier's budget closes it); while a
// call or an answer object is demanded, the end of sentence is masked inside
// it so that it cannot end before the call.
//
// Thread safety: RenderDeepseekRequest is a function over values; a
// controller runs on the engine's Step() thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/chat/api_error.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::chat {

// The ids of the format's added tokens in the served tokenizer.
struct DeepseekTokens {
  int bos = -1, eos = -1, user = -1, assistant = -1, think = -1, end_think = -1;
  static Result<DeepseekTokens> From(const engine::HfTokenizer& tokenizer);
};

// What the daemon serving a DeepSeek-V3.2 model renders and reads with.
struct DeepseekServing {
  std::shared_ptr<const engine::HfTokenizer> tokenizer;
  DeepseekTokens tokens;
  // The text tokens by their bytes, the added tokens left out (constrained output).
  std::shared_ptr<const TokenByteIndex> token_bytes;
  static Result<std::shared_ptr<const DeepseekServing>> Load(const std::string& tokenizer_json);
};

struct DeepseekPrompt {
  std::vector<int> prompt;  // ends with <｜Assistant｜><think> (or a tool block's <think>)
  std::shared_ptr<engine::DecodeController> controller;  // null: the output is free
  bool tools = false;  // tools were rendered: a DSML block in the output is a call
};

ApiResult<DeepseekPrompt> RenderDeepseekRequest(const ChatRequest& request,
                                                const std::shared_ptr<const DeepseekServing>& serving,
                                                const engine::GrammarLimits& limits);

// tool_choice required or named (see the top of this file).
class DsmlCallController : public engine::DecodeController {
 public:
  struct Parameter {
    std::string name;
    bool is_string = false;
    engine::JsonGrammar grammar;  // {"name": value} of the parameter's schema, fed up to the value
  };
  struct Choice {
    std::string name;
    std::vector<Parameter> parameters;  // the required ones, in the schema's order
  };
  DsmlCallController(std::shared_ptr<const DeepseekServing> serving, std::vector<Choice> choices);
  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

 private:
  enum class Phase { kReasoning, kName, kValue, kDone };
  std::vector<int> Force(const std::string& text, bool end = false);
  // After the name or a value: the next parameter's opening tag, or the end of the block.
  std::vector<int> Next(std::string lead);
  bool ValueMayEnd() const;
  std::shared_ptr<const DeepseekServing> serving_;
  std::vector<Choice> choices_;
  std::vector<int> closers_;  // tokens whose bytes begin "</｜DSML｜parameter>"
  const Choice* chosen_ = nullptr;
  size_t parameter_ = 0;
  std::optional<engine::JsonGrammar> value_;
  std::string name_written_;
  Phase phase_ = Phase::kReasoning;
  size_t skip_ = 0;      // forced tokens still to come back through OnToken
  bool broken_ = false;  // a refused token was emitted anyway (forced by the engine): no more constraint
};

}  // namespace moeserve::chat

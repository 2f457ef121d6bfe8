// Constrains a gpt-oss tool call's arguments by the function's JSON schema
// (the same engine::JsonGrammar as moe-dsa-v1's calls), for the calls tool_choice
// demands: named, or required with one tool (the prompt ends with the call's
// header, harmony_request.hpp), and required with several (the prompt ends
// with `to=functions.`: the name is constrained to the tools' names first).
//
// The grammar reads bytes, and o200k_harmony's tokens are multi-byte: at each
// step every text token whose bytes the grammar accepts from its state stays,
// the others (and every control token) are masked. The tokens are kept
// sorted by their bytes, so tokens sharing a prefix share its walk through
// the grammar and a refused prefix skips every token that starts with it.
// When the arguments are complete, <|call|> is forced.
//
// Thread safety: the index is immutable and shared; a controller runs on the
// engine's Step() thread only (engine::DecodeController).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"
#include "moeserve/chat/token_byte_index.hpp"

namespace moeserve::chat {


class HarmonyArgumentsController : public engine::DecodeController {
 public:
  // A call already opened: `grammar` is the function's parameters
  // (engine::JsonGrammar::ForObjectSchema); `call_token` is <|call|>.
  HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index, engine::JsonGrammar grammar, int call_token);

  // tool_choice required with several tools: the prompt ends with
  // `commentary to=functions.`, so the name comes first: one of `choices`
  // and a space, then `header_tail` (<|constrain|>json<|message|>) is forced
  // and that function's arguments follow.
  struct Choice {
    std::string name;
    engine::JsonGrammar grammar;
  };
  HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index, std::vector<Choice> choices,
                             std::vector<int> header_tail, int call_token);

  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

  // The ids allowed next (what Mask leaves), for tests.
  std::vector<int> Allowed(int vocab) const;

 private:
  std::vector<int> AllowedNames(int vocab) const;
  std::vector<int> AllowedArguments(int vocab) const;

  std::shared_ptr<const TokenByteIndex> index_;
  std::vector<Choice> choices_;   // while the name is written
  std::string name_written_;
  std::vector<int> header_tail_;
  std::optional<engine::JsonGrammar> grammar_;  // the arguments' grammar, once the function is known
  int call_token_;
  int skip_ = 0;          // forced tokens to come back through OnToken, not arguments
  bool done_ = false;     // the arguments are complete
  bool broken_ = false;   // a token the constraint refused was emitted anyway: no more constraint
};

}  // namespace moeserve::chat

// The DecodeController the daemon attaches to every chat sequence: it assigns
// tool-call ids and, when the request asks for it, constrains decoding.
//
//   kFree        tools offered with tool_choice auto: the model may answer or
//                call; the controller only writes the server-assigned id
//                after each <|tool_call|> (model.md section 8).
//   kNoTools     no tools, or tool_choice none: <|tool_call|> is masked.
//   kMustCall    tool_choice required or named: after the reasoning span the
//                output is one or more calls (one when parallel_tool_calls is
//                false or a function is named), each exactly
//                <|tool_call|>{"id":"<id>","name":"<name>","arguments":<json>}<|/tool_call|>
//                with <json> satisfying the function's parameters schema
//                (engine::JsonGrammar), then <|end|>.
//   kJsonObject  response_format json_object or json_schema: the answer
//                after the reasoning span is one JSON object (satisfying
//                `response_schema`), then <|end|>.
//
// Reasoning stays free in every mode (the engine's thinking budget closes it);
// only special tokens that would break the chat format are masked there.
//
// Thread safety: called only from the engine's Step() thread, as
// engine::DecodeController requires; ToolCallIds() may be read after the
// sequence finished.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <random>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::chat {

enum class DecodeMode { kFree, kNoTools, kMustCall, kJsonObject };

struct DecodePolicyOptions {
  DecodeMode mode = DecodeMode::kFree;
  std::vector<ToolSpec> tools;   // kMustCall: the functions that may be called
  bool parallel_calls = true;    // kMustCall: more than one call allowed
  int max_calls = 4;             // kMustCall with parallel calls
  // kJsonObject: the answer's schema (json_schema), and whether every keyword
  // must be enforced (its `strict`); tools carry their own `strict`.
  nlohmann::ordered_json response_schema = nlohmann::ordered_json{{"type", "object"}};
  bool response_strict = false;
  engine::GrammarLimits limits;
  uint64_t id_seed = 0;          // tool-call ids come from this seed (same seed, same ids)
};

class DecodePolicy : public engine::DecodeController {
 public:
  // Errors: kInvalidArgument when a tool's parameters schema (or the
  // response schema) cannot describe an object, cannot be satisfied, or holds
  // a keyword that is not enforced under strict; Error::field() is the
  // request field ("tools[1].function.parameters",
  // "response_format.json_schema.schema").
  static Result<std::shared_ptr<DecodePolicy>> Create(DecodePolicyOptions options);

  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

  // Is `token` allowed next? (Mask applies this to every id.)
  bool Allows(int token) const;

 private:
  enum class Phase {
    kReasoning,     // inside <|think|> ... <|/think|>
    kAnswer,        // free answer text (kFree, kNoTools)
    kFreeCall,      // kFree: inside a call span the model writes freely
    kExpectCall,    // kMustCall: <|tool_call|> must come next
    kCallPrefix,    // kMustCall: reading {"id":"..","name":  (the id part is forced)
    kCallName,      // kMustCall: one of the "<name>","arguments": literals
    kCallArgs,      // kMustCall: the arguments object
    kCallClose,     // kMustCall: the span's closing }
    kCallEnd,       // kMustCall: <|/tool_call|>
    kAfterCall,     // kMustCall: <|end|> or another <|tool_call|>
    kJson,          // kJsonObject: the object
    kJsonEnd,       // kJsonObject: <|end|>
    kFinished,
  };

  explicit DecodePolicy(DecodePolicyOptions options) : options_(std::move(options)), rng_(options_.id_seed) {}
  bool AllowsByte(uint8_t byte) const;
  bool FeedByte(uint8_t byte);  // advances the constrained phases
  void SetLiterals(Phase phase, std::vector<std::string> literals);

  DecodePolicyOptions options_;
  std::mt19937_64 rng_;
  std::vector<engine::JsonGrammar> tool_grammars_;     // kMustCall: one per tool, pristine
  std::optional<engine::JsonGrammar> json_template_;   // kJsonObject, pristine
  Phase phase_ = Phase::kReasoning;
  int calls_ = 0;
  // literal matching in kCallPrefix / kCallName / kCallClose
  std::vector<std::string> literals_;
  size_t literal_pos_ = 0;
  std::optional<engine::JsonGrammar> grammar_;  // the active grammar in kCallArgs / kJson
};

}  // namespace moeserve::chat

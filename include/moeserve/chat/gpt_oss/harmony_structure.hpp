// Keeps a gpt-oss generation inside harmony's structure when the model
// chooses for itself: tools offered under tool_choice auto, or a
// response_format. Every message header is one the request allows, a call the
// model opens has arguments that satisfy its function's schema, and a final
// answer under response_format satisfies the response schema. So the output
// always parses: no unknown recipient, no call to a function that was not
// offered, no invalid arguments, no control token inside a message.
//
// Headers (the prompt ends with `<|start|>assistant`; later messages start
// with <|start|>, the only token allowed between two messages):
//   assistant<|channel|>analysis<|message|>     reasoning: free text, then <|end|>
//   assistant<|channel|>final<|message|>        the answer: free text, then <|return|>;
//                                               under response_format the schema's
//                                               JSON, then <|return|> (forced)
//   assistant<|channel|>commentary<|message|>   a preamble (tools offered, no
//                                               response_format): free text, then <|end|>
//   assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
//                                               a call to an offered function: its
//                                               schema's JSON, then <|call|> (forced)
// These are the forms the harmony renderer writes and the gpt-oss models are
// trained on; the other spellings harmony allows (the recipient in the role
// part) are not offered.
//
// Headers are only masked, never forced: when the thinking budget ends an
// analysis message the engine forces `<|end|><|start|>assistant<|channel|>final<|message|>`,
// and those tokens walk the same paths. A token the constraint refuses (only
// a forced one can be) stops the constraining; the parser then reports the
// output as generated.
//
// Cost: the masks of headers and JSON bodies walk the vocabulary's text
// tokens (TokenByteIndex); free text masks only the control tokens.
//
// Thread safety: runs on the engine's Step() thread only (engine::DecodeController).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/harmony.hpp"

namespace moeserve::chat {

struct HarmonyStructureOptions {
  std::shared_ptr<const TokenByteIndex> index;
  engine::HarmonyTokens tokens;
  // The functions the model may call (tool_choice auto), with their arguments' grammars.
  std::vector<HarmonyArgumentsController::Choice> functions;
  // response_format: the final answer's grammar.
  std::optional<engine::JsonGrammar> response;
};

class HarmonyStructureController : public engine::DecodeController {
 public:
  explicit HarmonyStructureController(HarmonyStructureOptions options);

  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

  // The ids allowed next (what Mask leaves), for tests.
  std::vector<int> Allowed(int vocab) const;
  // Still constraining (no refused token seen).
  bool constraining() const { return phase_ != Phase::kBroken; }

 private:
  enum class Body { kFreeText, kFreeFinal, kJsonFinal, kCall };
  // A header, as units: a byte (0-255) or kControl + a control token's id.
  struct HeaderPath {
    std::vector<int> units;
    Body body = Body::kFreeText;
    int function = -1;  // kCall: index into functions
  };
  enum class Phase { kHeader, kBody, kBetween, kDone, kBroken };
  static constexpr int kControl = 256;

  void BeginHeader(const std::string& role_written);
  void BeginBody(const HeaderPath& path);
  std::vector<int> AllowedInHeader(int vocab) const;
  bool IsText(int id) const { return !options_.index->BytesOf(id).empty(); }
  // The id a free body ends with: <|end|> (analysis, preamble) or <|return|> (final).
  int FreeBodyEnd() const;

  HarmonyStructureOptions options_;
  std::vector<HeaderPath> paths_;
  Phase phase_ = Phase::kHeader;
  std::vector<int> written_;        // kHeader: the header's units so far
  std::vector<size_t> live_;        // kHeader: the paths `written_` is a prefix of
  Body body_ = Body::kFreeText;
  std::optional<engine::JsonGrammar> grammar_;  // kJsonFinal, kCall
  int terminator_ = -1;             // forced when the grammar is done
};

}  // namespace moeserve::chat

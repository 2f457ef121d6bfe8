// Constrains a gpt-oss tool call's arguments by the function's JSON schema
// (the same JsonGrammar as moe-dsa-v1's calls), for the calls the server
// opens itself (tool_choice named, or required with one tool: the prompt
// ends with the call's header, harmony_request.hpp).
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
#include <span>
#include <string>
#include <vector>

#include "moeserve/daemon/json_grammar.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::daemon {

// The vocabulary's text tokens by their bytes, built once per model.
class TokenByteIndex {
 public:
  static std::shared_ptr<const TokenByteIndex> Build(const engine::HfTokenizer& tokenizer);
  struct Entry {
    std::string bytes;
    int id = 0;
    int shared = 0;  // bytes in common with the previous entry
  };
  const std::vector<Entry>& entries() const { return entries_; }
  // The bytes of a text token (empty for control tokens and unknown ids).
  const std::string& BytesOf(int id) const;

 private:
  std::vector<Entry> entries_;
  std::vector<std::string> by_id_;
};

class HarmonyArgumentsController : public engine::DecodeController {
 public:
  // `grammar` is the function's parameters (JsonGrammar::ForObjectSchema);
  // `call_token` is <|call|>.
  HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index, JsonGrammar grammar, int call_token);

  void Mask(std::span<float> logits) override;
  std::vector<int> OnToken(int token) override;

  // The ids the grammar allows next (what Mask leaves), for tests.
  std::vector<int> Allowed(int vocab) const;

 private:
  std::shared_ptr<const TokenByteIndex> index_;
  JsonGrammar grammar_;
  int call_token_;
  bool done_ = false;     // the arguments are complete
  bool broken_ = false;   // a token the grammar refused was emitted anyway: no more constraint
};

}  // namespace moeserve::daemon

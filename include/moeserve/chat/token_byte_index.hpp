// A vocabulary's text tokens by their bytes, and the walk that finds which of
// them a JSON grammar accepts next: what every family's constrained decoding
// (tool calls, structured answers) masks the logits with. The tokens are kept
// sorted by their bytes, so tokens sharing a prefix share its walk through
// the grammar and a refused prefix skips every token that starts with it.
//
// Thread safety: the index is immutable and shared.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/engine/hf_tokenizer.hpp"
#include "moeserve/engine/json_grammar.hpp"

namespace moeserve::chat {

// The vocabulary's text tokens by their bytes, built once per model.
class TokenByteIndex {
 public:
  // `excluded`: ids that are never text here (a format's non-special added
  // tokens, such as Qwen3's <tool_call>, which mean structure when emitted).
  static std::shared_ptr<const TokenByteIndex> Build(const engine::HfTokenizer& tokenizer,
                                                     std::span<const int> excluded = {});
  struct Entry {
    std::string bytes;
    int id = 0;
    int shared = 0;  // bytes in common with the previous entry
    // Characters, when the bytes are plain string text (engine::JsonGrammar::PlainTextRoom:
    // from 0x20 up but '"' and '\\', whole valid UTF-8 characters); -1 otherwise.
    int plain_chars = -1;
  };
  const std::vector<Entry>& entries() const { return entries_; }
  // The bytes of a text token (empty for control tokens and unknown ids).
  const std::string& BytesOf(int id) const;

 private:
  std::vector<Entry> entries_;
  std::vector<std::string> by_id_;
};

// The text tokens whose bytes `grammar` accepts from its state (ids below vocab).
std::vector<int> TokensAcceptedBy(const TokenByteIndex& index, const engine::JsonGrammar& grammar, int vocab);
// Feeds a token's bytes; false when the grammar refuses one (the grammar is then unusable).
bool FeedTokenBytes(engine::JsonGrammar& grammar, const std::string& bytes);
// The text tokens (ids below vocab) that keep `written` plus their bytes a
// prefix of one of `targets`: a name being written towards one of the
// names a constrained call may take (each target ends with the byte that
// closes the name in its format).
std::vector<int> TokensContinuingOneOf(const TokenByteIndex& index, const std::string& written,
                                       const std::vector<std::string>& targets, int vocab);
// Sets every logit not in `allowed` to -infinity.
void MaskAllBut(std::span<float> logits, const std::vector<int>& allowed);

}  // namespace moeserve::chat

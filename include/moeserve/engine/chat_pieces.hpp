// A rendered chat prompt as pieces: the format's markers (added tokens, each
// encoded as its id) and text (everything else, encoded with no added-token
// matching, so client text that spells a marker stays text). Shared by the
// chat formats that render published templates into text first
// (qwen3_chat.hpp, deepseek_chat.hpp). Between markers the text is encoded
// as one piece, which is how Hugging Face splits on added tokens before its
// pre-tokenizer.
//
// Thread safety: free functions over values; a ChatPieceWriter is used by one
// thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::engine {

// One run of the rendered prompt: a template marker (its text is the added
// token's content) or text.
struct ChatPiece {
  bool marker = false;
  std::string text;
};

// Builds pieces: Template() text is the format's own (its markers become
// marker pieces), Text() is the client's (never a marker).
class ChatPieceWriter {
 public:
  // `markers`: the format's marker strings; they outlive the writer.
  explicit ChatPieceWriter(std::span<const std::string_view> markers) : markers_(markers) {}
  void Template(std::string_view text);
  void Text(std::string_view text);
  std::vector<ChatPiece> Take() { return std::move(pieces_); }

 private:
  std::span<const std::string_view> markers_;
  std::vector<ChatPiece> pieces_;
};

// The pieces as the template's text.
std::string JoinChatPieces(const std::vector<ChatPiece>& pieces);
// The pieces as token ids: markers by their added token's id (an error
// naming the token when the tokenizer has none), text with no added token
// matching.
Result<std::vector<int>> EncodeChatPieces(const HfTokenizer& tokenizer, const std::vector<ChatPiece>& pieces);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators,
// keys in the client's order (transformers' tojson, DeepSeek's to_json).
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

}  // namespace moeserve::engine

#include "moeserve/engine/chat_pieces.hpp"

namespace moeserve::engine {

namespace {

void DumpPython(const nlohmann::ordered_json& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += nlohmann::ordered_json(it.key()).dump();
      out += ": ";
      DumpPython(it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      DumpPython(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump();
  }
}

}  // namespace

void ChatPieceWriter::Template(std::string_view text) {
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    bool matched = false;
    if (text[i] == '<') {
      for (std::string_view m : markers_) {
        if (text.substr(i, m.size()) == m) {
          Text(text.substr(start, i - start));
          pieces_.push_back({true, std::string(m)});
          i += m.size();
          start = i;
          matched = true;
          break;
        }
      }
    }
    if (!matched) ++i;
  }
  Text(text.substr(start));
}

void ChatPieceWriter::Text(std::string_view text) {
  if (text.empty()) return;
  if (pieces_.empty() || pieces_.back().marker) pieces_.push_back({false, ""});
  pieces_.back().text += text;
}

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  DumpPython(value, out);
  return out;
}

std::string JoinChatPieces(const std::vector<ChatPiece>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += p.text;
  return out;
}

Result<std::vector<int>> EncodeChatPieces(const HfTokenizer& tokenizer, const std::vector<ChatPiece>& pieces) {
  std::vector<int> ids;
  for (const auto& p : pieces) {
    if (p.marker) {
      auto id = tokenizer.TokenId(p.text);
      if (!id) return Fail(Error::InvalidArgument("the tokenizer has no token " + p.text + " (the chat format needs it)"));
      ids.push_back(*id);
      continue;
    }
    MOE_ASSIGN_OR_RETURN(std::vector<int> text, tokenizer.Encode(p.text, AddedTokenText::kAllAsText));
    ids.insert(ids.end(), text.begin(), text.end());
  }
  return ids;
}

}  // namespace moeserve::engine

// Encoding through a loaded pipeline, and the public HfTokenizer calls.
#include <fstream>
#include <sstream>

#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine {

namespace hf {

void Pipeline::Encode(std::string_view text, AddedTokenText mode, std::vector<int>& ids) const {
  if (mode == AddedTokenText::kAllAsText || raw_tokens.empty()) {
    EncodeNormalizedPiece(text, mode, ids);
    return;
  }
  for (const auto& seg : raw_tokens.Split(text, mode == AddedTokenText::kSpecialAsText)) {
    if (seg.token) {
      ids.push_back(seg.token->id);
    } else {
      EncodeNormalizedPiece(text.substr(seg.start, seg.end - seg.start), mode, ids);
    }
  }
}

// A piece between raw added tokens: normalized on its own, then split at the
// added tokens that match normalized text.
void Pipeline::EncodeNormalizedPiece(std::string_view piece, AddedTokenText mode, std::vector<int>& ids) const {
  if (piece.empty()) return;
  std::string text(piece);
  normalizer.Normalize(text);
  if (mode == AddedTokenText::kAllAsText || normalized_tokens.empty()) {
    EncodeModel(std::move(text), ids);
    return;
  }
  for (const auto& seg : normalized_tokens.Split(text, mode == AddedTokenText::kSpecialAsText)) {
    if (seg.token) {
      ids.push_back(seg.token->id);
    } else {
      EncodeModel(text.substr(seg.start, seg.end - seg.start), ids);
    }
  }
}

void Pipeline::EncodeModel(std::string text, std::vector<int>& ids) const {
  if (text.empty()) return;
  std::vector<std::string> pieces;
  pieces.push_back(std::move(text));
  PreTokenize(pre_tokenizer, pieces);
  for (const std::string& word : pieces) model.Tokenize(word, ids);
}

}  // namespace hf

Result<HfTokenizer> HfTokenizer::FromJsonText(std::string_view json_text, std::string_view source) {
  MOE_ASSIGN_OR_RETURN(std::shared_ptr<const hf::Pipeline> pipeline, hf::LoadPipeline(json_text, source));
  return HfTokenizer(std::move(pipeline));
}

Result<HfTokenizer> HfTokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::NotFound(path + ": cannot open tokenizer file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Fail(Error::Io(path + ": read failed"));
  return FromJsonText(text.str(), path);
}

Result<std::vector<int>> HfTokenizer::Encode(std::string_view text, AddedTokenText mode) const {
  if (!hf::IsValidUtf8(text)) return Fail(Error::InvalidArgument("text to encode is not valid UTF-8"));
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 1);
  pipeline_->Encode(text, mode, ids);
  return ids;
}

std::string HfTokenizer::Decode(std::span<const int> ids, bool skip_special_tokens) const {
  std::string out;
  HfStreamDecoder stream(*this, skip_special_tokens);
  for (int id : ids) out += stream.Push(id);
  out += stream.Finish();
  return out;
}

int HfTokenizer::vocab_size() const { return static_cast<int>(pipeline_->token_text.size()); }

std::optional<int> HfTokenizer::TokenId(std::string_view token) const {
  if (auto it = pipeline_->added_by_content.find(token); it != pipeline_->added_by_content.end()) return it->second;
  if (auto it = pipeline_->model.vocab.find(token); it != pipeline_->model.vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string_view> HfTokenizer::TokenText(int id) const {
  if (id < 0 || id >= vocab_size() || pipeline_->token_text[static_cast<size_t>(id)].empty()) return std::nullopt;
  return pipeline_->token_text[static_cast<size_t>(id)];
}

bool HfTokenizer::IsSpecial(int id) const {
  return id >= 0 && id < vocab_size() && pipeline_->is_special[static_cast<size_t>(id)];
}

std::string_view HfTokenizer::TokenBytes(int id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return pipeline_->token_bytes[static_cast<size_t>(id)];
}

std::string HfStreamDecoder::Push(int id) {
  if (skip_special_ && tokenizer_->IsSpecial(id)) return {};
  return utf8_.Push(tokenizer_->TokenBytes(id));
}

}  // namespace moeserve::engine

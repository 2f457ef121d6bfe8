// The shared half of the dialects that serve a published chat template from
// the model's tokenizer.json (Qwen3-Next's ChatML, DeepSeek-V3.2's
// encoding): the prompt is the template's tokens and ends inside an opened
// reasoning span; the family's end tokens stop the output (the engine's
// defaults); the controller tool_choice and response_format demand is made
// as the request renders. Each family supplies its template, its reader and
// how its entries count.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/chat/dialect.hpp"
#include "moeserve/engine/chat_pieces.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::chat {

// The model's tokenizer.json for `family`'s chat (errors say the family needs it).
Result<std::shared_ptr<const engine::HfTokenizer>> LoadChatTokenizer(const std::string& tokenizer_json,
                                                                     std::string_view family);
// The id of a marker the family's format cannot do without.
Result<int> RequiredMarker(const engine::HfTokenizer& tokenizer, std::string_view marker, std::string_view family);
// The ids of those of `markers` the tokenizer has.
std::vector<int> PresentMarkers(const engine::HfTokenizer& tokenizer, std::span<const std::string_view> markers);

class TemplateDialect : public ChatDialect {
 public:
  // A request in the template: its prompt, the controller it needs (null:
  // free), and whether tools were rendered (a call in the output is then a call).
  struct TemplatePrompt {
    std::vector<int> prompt;
    std::shared_ptr<engine::DecodeController> controller;
    bool tools = false;
  };

  ApiResult<std::unique_ptr<RenderedTurn>> Render(const ChatRequest& request, const RenderOptions& options) const final;
  Result<std::vector<int>> PublicPrefix(const std::string& system_prompt) const final;
  const engine::HfTokenizer* logprobs_tokenizer() const final { return tokenizer_.get(); }
  // Rendered as the stateless endpoint renders the turn, so the count is the
  // prompt_tokens the turn will report.
  std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                      const nlohmann::ordered_json& tools, const ChatRequest& turn) const final;
  // The messages without tools, after a reasoning span, greedy.
  std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                          int max_tokens, int thinking_budget,
                                                          uint64_t seed) const final;
  std::unique_ptr<OutputReader> MakeSummaryReader() const final { return MakeReader({}, std::nullopt, false); }
  // The entry's words as encoded, plus the family's markers around its kind
  // (a summary counts as a turn of its header and text).
  int64_t EntryTokens(const TranscriptEntry& entry) const final;

  // The family's parts.
  virtual ApiResult<TemplatePrompt> RenderTemplate(const ChatRequest& request,
                                                   const engine::GrammarLimits& limits) const = 0;
  // A system message alone, without a generation prompt (the public prefix).
  virtual Result<std::vector<engine::ChatPiece>> SystemPieces(const engine::ChatMessage& system) const = 0;
  virtual std::unique_ptr<OutputReader> MakeReader(std::vector<std::string> stop, std::optional<uint64_t> call_id_seed,
                                                   bool tools) const = 0;

 protected:
  explicit TemplateDialect(std::shared_ptr<const engine::HfTokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {}
  // Tokens of plain text as the template encodes it (markers' text stays text); bytes if it cannot be encoded.
  int64_t Words(std::string_view text) const;
  // What each kind of entry adds around its words in the template (its
  // markers and fixed text), set by the family's constructor.
  struct EntryMarkers {
    int64_t turn = 0, reasoning = 0, call = 0, result = 0;
  };
  EntryMarkers markers_;
  // The tokens a call's arguments take in the family's call syntax.
  virtual int64_t CallArgumentTokens(const nlohmann::ordered_json& arguments) const = 0;

 private:
  std::shared_ptr<const engine::HfTokenizer> tokenizer_;
};

}  // namespace moeserve::chat

// A model family's chat dialect: everything the daemon needs from a family
// to serve its chat, behind one interface, so that the daemon holds no
// family's name. It decides the family once, at load (LoadDialect), and then
// only calls through this interface:
//
//   render        a request (messages, tools and tool results, images,
//                 reasoning effort, response_format) to the family's prompt
//                 tokens, with the stops the output ends on
//   constrain     the decode controller that tool_choice and response_format
//                 demand (the family's grammar over its own markers)
//   read          the output stream into reasoning, content and tool calls
//                 (an OutputReader of the family's format)
//   sessions      how a kept conversation's prompt and entries count, how its
//                 summary is generated and read, whether its prompt is pinned
//   start-up      the public system prompt's tokens, the tiers' default
//                 budgets, the vision tower, the tokenizer logprobs spell with
//
// Each family's dialect lives in its folder under chat/ (chat/<family>/),
// registered by one line in chat/dialect_registry.cpp, keyed by the family's
// registry name (engine::FamilyEntry::name).
//
// Thread safety: a dialect is immutable after loading and may be used from
// any thread; a RenderedTurn and the readers it makes belong to one request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/chat/api_error.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/output_reader.hpp"
#include "moeserve/chat/transcript_entry.hpp"
#include "moeserve/common/status.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::chat {

// What a render may need beyond the request.
struct RenderOptions {
  ReasoningEffort effort = ReasoningEffort::kMedium;  // the tier the request runs at
  engine::GrammarLimits limits;                       // constrained strings' bounds
};

// One request rendered in the family's format. Created by Render, used once
// by the request that rendered it: Controller once before the sequence is
// submitted, Reader for its output.
class RenderedTurn {
 public:
  virtual ~RenderedTurn() = default;
  // The decode controller the request's tool_choice and response_format
  // demand (null: the output is free). `id_seed` is the seed the server's
  // tool-call ids are drawn from (the reader replays it). A schema the
  // family's grammar cannot follow is a 400 naming the field.
  virtual ApiResult<std::shared_ptr<engine::DecodeController>> Controller(uint64_t id_seed) = 0;
  // Reads the sequence's tokens; `stop` strings cut the content.
  virtual std::unique_ptr<OutputReader> Reader(std::vector<std::string> stop, uint64_t id_seed) const = 0;

  std::vector<int> prompt;
  std::vector<engine::ImageSpan> images;  // the prompt's image spans, in order
  bool starts_in_reasoning = true;        // the prompt leaves the model inside a reasoning span
  std::vector<int> stop_tokens;           // empty: the family's defaults (engine::ChatHooks::DefaultStops)
};

class ChatDialect {
 public:
  virtual ~ChatDialect() = default;
  // The family's registry name ("moe-dsa-v1", "gpt-oss", ...): for logs.
  virtual std::string family() const = 0;

  // The request's prompt, or a 400 naming the field that does not render.
  // Image parts are already in the messages (their placeholders), decoded
  // for the model's tower (vision()).
  virtual ApiResult<std::unique_ptr<RenderedTurn>> Render(const ChatRequest& request,
                                                          const RenderOptions& options) const = 0;
  // The configured public system prompt rendered on its own: a prompt that
  // begins with these tokens shares their cached state across tenants.
  virtual Result<std::vector<int>> PublicPrefix(const std::string& system_prompt) const = 0;
  // The tiers' thinking budgets when the configuration names none (negative:
  // no budget).
  virtual engine::ThinkingBudgets DefaultBudgets() const { return {-1, -1, -1}; }
  // The model's vision tower, when it has one (image parts are refused otherwise).
  virtual std::optional<engine::VisionConfig> vision() const { return std::nullopt; }
  // The tokenizer logprobs spell tokens with; null: the tokens are bytes.
  virtual const engine::HfTokenizer* logprobs_tokenizer() const { return nullptr; }

  // Sessions (server-kept conversations).
  // The tokens of the prompt `messages` render to (generation prompt
  // included), given the session's `tools` and the turn's request (its
  // tool_choice and reasoning_effort); nothing when they do not render.
  virtual std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                              const nlohmann::ordered_json& tools, const ChatRequest& turn) const = 0;
  // What one entry adds to a rendered prompt (a model summary must count
  // fewer than the entries it replaces).
  virtual int64_t EntryTokens(const TranscriptEntry& entry) const = 0;
  // Keeps the prompt of `messages` cached for `seconds` under `key`, where
  // the family's prompts can be pinned; otherwise nothing.
  virtual void PinPrompt(uint64_t key, const std::vector<engine::ChatMessage>& messages,
                         const nlohmann::ordered_json& tools, double seconds) const {
    (void)key, (void)messages, (void)tools, (void)seconds;
  }
  // Drops the pin under `key`.
  virtual void Unpin(uint64_t key) const { (void)key; }
  // The generation that writes a summary of `messages`: at most
  // `max_tokens`, of which at most `thinking_budget` reasoning (-1: no
  // limit), greedy, seeded with `seed`, no tools. Nothing when it does not render.
  virtual std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                                  int max_tokens, int thinking_budget,
                                                                  uint64_t seed) const = 0;
  // Reads a summary generation's tokens; content() is the summary's text.
  virtual std::unique_ptr<OutputReader> MakeSummaryReader() const = 0;
};

// What a dialect loads from: the model's directory and its running engine
// (its tokenizer, config and prefix cache), and the daemon's default effort.
struct DialectInputs {
  std::string model_dir;
  engine::Engine* engine = nullptr;
  ReasoningEffort default_effort = ReasoningEffort::kMedium;
};

// The dialect of `family` (engine::FamilyEntry::name); an error names a
// family without a chat dialect, or what the family's files lack.
Result<std::shared_ptr<const ChatDialect>> LoadDialect(const std::string& family, const DialectInputs& inputs);

// The families that have a chat dialect, in registry order.
std::vector<std::string> DialectFamilies();

}  // namespace moeserve::chat

// What a server-kept session needs from the model family the daemon serves
// (session_service.hpp): how the family counts a prompt, how many tokens
// one stored entry stands for, how its summaries are generated and read,
// and whether a session's prompt can be pinned in a cache.
//
//   family       prompt tokens             entry tokens                 summary generation
//   moe-dsa-v1   RenderChat with the       UTF-8 bytes plus the         RenderChat, starts in <|think|>,
//                session's tools           markers (ByteEntryTokens)    read by OutputAssembler
//   gpt-oss      RenderHarmonyRequest, as  the o200k_harmony tokens of  RenderHarmonyChat at low effort,
//                the stateless endpoint    the entry's text plus its    harmony's stop tokens, read by
//                renders the turn (effort, message's header and end     HarmonyAssembler: the final (or
//                tool_choice, call header) markers                      preamble) text, never analysis
//   qwen3_next   RenderQwen3Request, as    the entry's tokens plus its  RenderQwen3Request without tools,
//                the stateless endpoint    turn's marker tokens         starts in <think>, read by
//                renders the turn                                       Qwen3Assembler (never reasoning)
//   deepseek_v32 RenderDeepseekRequest, as the entry's tokens plus its  RenderDeepseekRequest without tools,
//                the stateless endpoint    DSML markup and marker       starts in <think>, read by
//                renders the turn          tokens                       DeepseekAssembler (never reasoning)
//
// The session keeps every entry whatever the family; only rendering differs
// (harmony drops the reasoning of assistant messages up to the last final
// answer, so a gpt-oss prompt leaves out reasoning the session still stores).
//
// Thread safety: the methods are const and may be called from any thread;
// a reader from MakeSummaryReader belongs to one sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/chat_request.hpp"
#include "moeserve/daemon/deepseek_request.hpp"
#include "moeserve/daemon/harmony_request.hpp"
#include "moeserve/daemon/output_assembler.hpp"
#include "moeserve/daemon/qwen3_request.hpp"
#include "moeserve/daemon/session_history.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/engine.hpp"

namespace moeserve::daemon {

class SessionModel {
 public:
  virtual ~SessionModel() = default;

  // The tokens of the prompt the family renders for `messages` (generation
  // prompt included), given the session's `tools` and the turn's request
  // (its tool_choice and reasoning_effort); nothing when they do not render.
  virtual std::optional<int64_t> PromptTokens(const std::vector<engine::ChatMessage>& messages,
                                              const nlohmann::ordered_json& tools,
                                              const ChatRequest& turn) const = 0;
  // What one entry adds to a rendered prompt (GET's `tokens`; a model
  // summary must count fewer than the entries it replaces).
  virtual int64_t EntryTokens(const SessionEntry& entry) const = 0;
  // Keeps the prompt of `messages` cached for `seconds` under `key`, where
  // the family's cache can pin; otherwise nothing.
  virtual void PinPrompt(uint64_t key, const std::vector<engine::ChatMessage>& messages,
                         const nlohmann::ordered_json& tools, double seconds) const {
    (void)key, (void)messages, (void)tools, (void)seconds;
  }
  // Drops the pin under `key` (a deleted session).
  virtual void Unpin(uint64_t key) const { (void)key; }
  // The generation that writes a summary from `messages` (the fixed
  // instruction and the transcript): at most `max_tokens`, of which at most
  // `thinking_budget` reasoning (-1: no limit), greedy, seeded with `seed`;
  // no tools. Nothing when the prompt does not render.
  virtual std::optional<engine::GenerationRequest> SummaryRequest(const std::vector<engine::ChatMessage>& messages,
                                                                  int max_tokens, int thinking_budget,
                                                                  uint64_t seed) const = 0;
  // Reads a summary generation's tokens; content() is the summary's text.
  virtual std::unique_ptr<OutputReader> MakeSummaryReader() const = 0;
};

// moe-dsa-v1 (model.md section 8). `engine` (may be null) pins prompts in
// its prefix cache.
std::shared_ptr<const SessionModel> MoeDsaSessionModel(engine::Engine* engine);

// gpt-oss: harmony with `serving`'s tokenizer; a turn without a
// reasoning_effort renders at `default_effort` (ServingFacts).
std::shared_ptr<const SessionModel> HarmonySessionModel(std::shared_ptr<const HarmonyServing> serving,
                                                        ReasoningEffort default_effort);

// Qwen3-Next: its ChatML (qwen3_request.hpp) with `serving`'s tokenizer.
std::shared_ptr<const SessionModel> Qwen3SessionModel(std::shared_ptr<const Qwen3Serving> serving);

// DeepSeek-V3.2: its published encoding (deepseek_request.hpp) with `serving`'s tokenizer.
std::shared_ptr<const SessionModel> DeepseekSessionModel(std::shared_ptr<const DeepseekServing> serving);

}  // namespace moeserve::daemon

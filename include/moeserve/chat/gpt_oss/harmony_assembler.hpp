// The OutputReader of the gpt-oss family: a sequence's generated ids through
// harmony's output parser (engine::HarmonyOutputParser), as the same deltas
// and final message the moe-dsa-v1 OutputAssembler produces, so that the
// completion sink answers both families alike (docs/chat-formats.md).
//
//   analysis                          -> reasoning_content
//   commentary to=functions.NAME      -> a tool call (id drawn from the
//                                        request's call-id seed, as for moe-dsa-v1)
//   final, commentary preamble        -> content (stop strings apply here)
//
// Text is whole UTF-8 characters in every delta (the parser decodes per
// message). Output that breaks the format ends the answer where it broke:
// StopMatched() turns true (the sink cancels the sequence and answers with
// what was read) and format_error() names the fault.
//
// `logprobs` are carried for the content tokens only (the text tokens of
// final and commentary-preamble messages): never for reasoning, tool-call
// arguments, headers or control tokens. As in OutputAssembler, a token goes
// out with the delta whose text completes its bytes, text held back for a
// stop string holds back its tokens, and tokens whose text a stop string cuts
// are never reported.
//
// Thread safety: one assembler per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"
#include "moeserve/engine/harmony.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::chat {

struct HarmonyAssemblerOptions {
  const engine::HfTokenizer* tokenizer = nullptr;  // outlives the assembler (the engine's)
  engine::HarmonyTokens tokens;
  std::vector<std::string> tool_names;  // the functions the model may call
  std::vector<std::string> stop;
  std::optional<uint64_t> call_id_seed;
  // Tokens the prompt already holds after `<|start|>assistant` (a call
  // header the server wrote for tool_choice named): read before the first
  // generated id, their deltas (the call's id and name) go out with its.
  std::vector<int> prefill;
};

class HarmonyAssembler : public OutputReader {
 public:
  explicit HarmonyAssembler(HarmonyAssemblerOptions options);
  // The parser's id source points into this object.
  HarmonyAssembler(const HarmonyAssembler&) = delete;
  HarmonyAssembler& operator=(const HarmonyAssembler&) = delete;

  OutputDelta OnToken(int token, bool reasoning, const ContentLogprob* logprob = nullptr) override;
  OutputDelta Finish() override;
  bool StopMatched() const override { return answer_.stop_matched() || malformed_; }
  const std::string& reasoning() const override { return reasoning_; }
  const std::string& content() const override { return answer_.text(); }
  const std::vector<AssembledToolCall>& tool_calls() const override { return calls_; }
  const std::vector<ContentLogprob>& content_logprobs() const override { return answer_.logprobs(); }
  int tool_call_parse_errors() const override { return parse_errors_; }
  std::string FormatFault() const override { return malformed_ ? parser_.error() : ""; }

  // The parser's message when the output broke the format (or was cut off at Finish); empty otherwise.
  const std::string& format_error() const { return parser_.error(); }
  engine::HarmonyEnd end() const { return parser_.end(); }

 private:
  void Apply(std::vector<engine::HarmonyDelta> deltas, OutputDelta& out);

  const engine::HfTokenizer* tokenizer_;
  std::optional<std::mt19937_64> id_rng_;
  engine::HarmonyOutputParser parser_;
  StopTrimmedContent answer_;  // content, stop strings, logprobs
  OutputDelta held_;  // the prefill's deltas, sent with the first token's
  bool malformed_ = false;
  bool finished_ = false;
  std::string reasoning_;
  std::vector<AssembledToolCall> calls_;
  int parse_errors_ = 0;
};

}  // namespace moeserve::chat

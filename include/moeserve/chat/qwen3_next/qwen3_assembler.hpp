// The OutputReader of the Qwen3-Next family: a sequence's generated ids read
// as the published chat format writes an assistant turn, into the same
// deltas and final message as the other families' readers
// (output_assembler.hpp):
//
//   until </think>               -> reasoning_content (the prompt opened <think>);
//                                   newlines next to the markers are the format's,
//                                   not the text's (the template strips them)
//   <tool_call>{json}</tool_call> -> a tool call: {"name": .., "arguments": ..}; the
//                                   id is drawn from the request's call-id seed
//   other text                   -> content (leading newlines after </think> and
//                                   newlines before a call dropped; stop strings apply)
//   <|im_end|>, <|endoftext|>    -> the end; other special tokens are dropped
// A call whose body is not such an object (or that never closes) is returned
// as content text, markers included, and counted in tool_call_parse_errors.
// A call goes out as one delta when its </tool_call> arrives.
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
#include "moeserve/chat/qwen3_next/qwen3_request.hpp"

namespace moeserve::chat {

class Qwen3Assembler : public OutputReader {
 public:
  // `serving` outlives the assembler.
  Qwen3Assembler(const Qwen3Serving& serving, std::vector<std::string> stop, std::optional<uint64_t> call_id_seed);

  OutputDelta OnToken(int token, bool reasoning, const ContentLogprob* logprob = nullptr) override;
  OutputDelta Finish() override;
  bool StopMatched() const override { return answer_.stop_matched(); }
  const std::string& reasoning() const override { return reasoning_; }
  const std::string& content() const override { return answer_.text(); }
  const std::vector<AssembledToolCall>& tool_calls() const override { return calls_; }
  const std::vector<ContentLogprob>& content_logprobs() const override { return answer_.logprobs(); }
  int tool_call_parse_errors() const override { return parse_errors_; }

 private:
  void Reasoning(const std::string& text, OutputDelta& out);
  void Content(const std::string& text, OutputDelta& out);
  void CloseCall(OutputDelta& out);

  const Qwen3Serving& serving_;
  StopTrimmedContent answer_;  // content, stop strings, logprobs
  std::optional<std::mt19937_64> id_rng_;
  bool in_think_ = true, in_call_ = false, ended_ = false, finished_ = false;
  bool reasoning_started_ = false, content_started_ = false;
  size_t reasoning_newlines_ = 0, content_newlines_ = 0;  // held back: they may be the format's
  engine::Utf8StreamDecoder reasoning_decoder_, content_decoder_;
  std::string span_;  // the call being read, raw bytes
  std::string reasoning_;
  std::vector<AssembledToolCall> calls_;
  int parse_errors_ = 0;
};

}  // namespace moeserve::chat

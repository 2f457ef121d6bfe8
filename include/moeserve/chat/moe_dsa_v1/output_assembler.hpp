// Turns one sequence's generated tokens into what the API returns: reasoning
// text, answer text and tool calls, both as incremental deltas (streaming)
// and as the final message (non-streaming). Feeding the same tokens gives the
// same final message either way, and the streamed deltas concatenate to it.
//
// Routing (model.md section 8):
//   - bytes inside <|think|>..<|/think|> go to reasoning_content;
//   - <|tool_call|> .. <|/tool_call|> is a call, wherever it appears (a call
//     opened inside the reasoning span is still a call, never reasoning text);
//   - other bytes go to content; <|end|> / <|eos|> end the message; other
//     special tokens are dropped.
// Text is UTF-8 decoded per channel (Utf8StreamDecoder), so no delta ends in
// half a character. `stop` strings apply to content: the content is cut
// before the first match and StopMatched() turns true (the caller cancels
// the sequence); a partial match at the end is held back until resolved.
//
// A call streams as: first a delta with index, id and name (once the span's
// `{"id":..,"name":..,"arguments":` head has been read), then the arguments
// text in pieces; the closing brace of the span is held back until the span
// ends, so the pieces add up exactly to the final arguments.
//
// Thread safety: one assembler per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "moeserve/chat/output_reader.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::chat {

struct AssemblerOptions {
  std::vector<std::string> stop;
  // The seed the decode policy draws call ids from (DecodePolicyOptions::id_seed).
  std::optional<uint64_t> call_id_seed;
  // Constrained calls (tool_choice required or named): the names the model may write.
  std::vector<std::string> constrained_names;
};

class OutputAssembler : public OutputReader {
 public:
  explicit OutputAssembler(std::vector<std::string> stop = {}) : answer_(std::move(stop)) {}
  explicit OutputAssembler(AssemblerOptions options);

  OutputDelta OnToken(int token, bool reasoning, const ContentLogprob* logprob = nullptr) override;
  OutputDelta Finish() override;

  bool StopMatched() const override { return answer_.stop_matched(); }
  bool Ended() const { return ended_; }  // <|end|>/<|eos|> seen or a stop matched

  const std::string& reasoning() const override { return reasoning_; }
  const std::string& content() const override { return answer_.text(); }
  const std::vector<AssembledToolCall>& tool_calls() const override { return calls_; }
  const std::vector<ContentLogprob>& content_logprobs() const override { return answer_.logprobs(); }
  int tool_call_parse_errors() const override { return parse_errors_; }

 private:
  void AppendContent(const std::string& text, OutputDelta& out);
  void SpanBytes(const std::string& text, OutputDelta& out);
  void CloseSpan(OutputDelta& out);

  StopTrimmedContent answer_;  // content, stop strings, logprobs
  std::optional<std::mt19937_64> id_rng_;  // replays the decode policy's ids
  std::vector<std::string> constrained_names_;
  std::string expected_id_;                // the id of the call being read, when known
  bool ended_ = false;
  bool in_think_ = true;  // chat generation starts inside <|think|>
  bool in_span_ = false;

  engine::Utf8StreamDecoder reasoning_decoder_, content_decoder_, span_decoder_;
  std::string reasoning_;

  // the call being read
  std::string span_;             // decoded span text so far
  bool head_sent_ = false;       // id/name delta sent
  size_t args_start_ = 0;        // offset of the arguments in span_
  size_t args_sent_ = 0;         // bytes of arguments already streamed
  std::vector<AssembledToolCall> calls_;
  int parse_errors_ = 0;
};

}  // namespace moeserve::chat

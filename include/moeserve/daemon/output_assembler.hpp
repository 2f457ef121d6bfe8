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
#include <utility>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::daemon {

struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;    // first delta of a call only
  std::optional<std::string> name;  // first delta of a call only
  std::string arguments;            // a piece of the arguments text
};

// The log-probabilities of one content token (api.md, logprobs), as the
// engine reported them when it sampled the token.
struct ContentLogprob {
  int token = 0;
  float logprob = 0;
  std::vector<engine::TokenLogprob> top;
};

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  // The tokens whose text is in `content` (held-back text holds back its
  // tokens; tokens cut by a stop string are never reported).
  std::vector<ContentLogprob> logprobs;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty() && logprobs.empty(); }
};

struct AssembledToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  bool arguments_valid = false;  // arguments parsed as a JSON object
};

struct AssemblerOptions {
  std::vector<std::string> stop;
  // The seed the decode policy draws call ids from (DecodePolicyOptions::id_seed).
  std::optional<uint64_t> call_id_seed;
  // Constrained calls (tool_choice required or named): the names the model may write.
  std::vector<std::string> constrained_names;
};

// The content channel of an answer as the client sees it: decoded text goes
// out as it arrives, except a tail that could still grow into a stop string;
// a stop string ends the content where it begins; each content token's
// log-probabilities go out with the text it made, never before it and never
// for text a stop string cut. One owner for this rule, used by the output
// reader of every chat format (moe-dsa-v1, harmony, Qwen3 ChatML);
// daemon/stop_trimmed_content.cpp.
class StopTrimmedContent {
 public:
  explicit StopTrimmedContent(std::vector<std::string> stop = {}) : stop_(std::move(stop)) {}

  // A content token's log-probabilities, before the text it decodes into
  // arrives (a token may end inside a UTF-8 sequence).
  void AddLogprob(const ContentLogprob& logprob) { undecoded_.push_back(logprob); }
  // Forgets log-probabilities of tokens whose text will not be content (the
  // format took it).
  void DropUndecodedLogprobs() { undecoded_.clear(); }
  // Decoded content text: released into `out` up to what may still begin a
  // stop string; a matched stop string ends the content there.
  void Append(const std::string& text, OutputDelta& out);
  // The end of the answer: releases the held-back tail.
  void Flush(OutputDelta& out);

  bool stop_matched() const { return stop_matched_; }
  const std::string& text() const { return released_text_; }          // what the client got
  const std::vector<ContentLogprob>& logprobs() const { return logprobs_; }  // what the deltas carried

 private:
  void Release(OutputDelta& out, bool all);

  std::vector<std::string> stop_;
  bool stop_matched_ = false;
  std::string all_;            // decoded content, before stop handling
  size_t released_ = 0;        // how much of all_ went out
  std::string released_text_;  // all_[0, released_)
  // Not yet decoded into text, then waiting with the offset in all_ where
  // their text ends.
  std::vector<ContentLogprob> undecoded_;
  std::vector<std::pair<size_t, ContentLogprob>> held_;
  std::vector<ContentLogprob> logprobs_;
};


// What a completion's sink reads one sequence's tokens through, whatever the
// chat format: OutputAssembler (this file) for moe-dsa-v1, HarmonyAssembler
// (harmony_assembler.hpp) for gpt-oss.
class OutputReader {
 public:
  virtual ~OutputReader() = default;
  // One generated token (`reasoning` as TokenEvent::reasoning reports it),
  // with its log-probabilities when the request asked for them.
  virtual OutputDelta OnToken(int token, bool reasoning, const ContentLogprob* logprob = nullptr) = 0;
  // End of generation: flushes held-back text and an unfinished call.
  virtual OutputDelta Finish() = 0;
  // The answer is over before the engine stopped (a stop string matched, or
  // the format says so): the caller cancels the sequence, and the finish
  // reason is "stop".
  virtual bool StopMatched() const = 0;
  virtual const std::string& reasoning() const = 0;
  virtual const std::string& content() const = 0;
  virtual const std::vector<AssembledToolCall>& tool_calls() const = 0;
  // Every content token's log-probabilities, in order (what the deltas carried).
  virtual const std::vector<ContentLogprob>& content_logprobs() const = 0;
  virtual int tool_call_parse_errors() const = 0;
  // What broke the chat format when the output did (the answer then ended
  // there); empty otherwise.
  virtual std::string FormatFault() const { return ""; }
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

}  // namespace moeserve::daemon

// What every family's output reader gives the daemon: a sequence's tokens as
// incremental deltas (reasoning, content, tool calls, content logprobs) and
// as the final message. Feeding the same tokens gives the same final message
// either way, and the streamed deltas concatenate to it. Each family's chat
// dialect (dialect.hpp) makes the reader of its own format.
//
// Thread safety: one reader per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moeserve/engine/engine.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::chat {

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

}  // namespace moeserve::chat

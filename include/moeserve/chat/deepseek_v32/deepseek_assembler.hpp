// The OutputReader of the DeepSeek-V3.2 family: a sequence's generated ids
// read as the published encoding writes an assistant turn
// (parse_message_from_completion_text of encoding_dsv32.py), into the same
// deltas and final message as the other families' readers
// (output_assembler.hpp):
//
//   until </think>                       -> reasoning_content (the prompt opened <think>)
//   "\n\n<｜DSML｜function_calls>\n ... </｜DSML｜function_calls>"
//                                        -> tool calls, when the request rendered tools: each
//                                           <｜DSML｜invoke name="..">..</｜DSML｜invoke> is one call,
//                                           its parameters the arguments as the published
//                                           decoder builds them (DsmlArgumentsJson); the id is
//                                           drawn from the request's call-id seed
//   other text                           -> content (the two newlines before a block are the
//                                           format's; stop strings apply)
//   <｜end▁of▁sentence｜>                  -> the end; other added tokens are dropped
// The DSML markup is text, not tokens: a tail of content that may still grow
// into the block's opening is held back until it does or cannot. A block the
// published decoder would refuse (or that never closes) is returned as
// content text, markup included, and counted in tool_call_parse_errors; a
// call whose arguments are not a JSON object (a string="false" value that is
// not JSON) is returned with arguments_valid false and counted too. A call
// goes out as one delta when its </｜DSML｜invoke> arrives.
//
// Thread safety: one assembler per sequence, used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "moeserve/chat/deepseek_v32/deepseek_request.hpp"
#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"

namespace moeserve::chat {

class DeepseekAssembler : public OutputReader {
 public:
  // `serving` outlives the assembler. `tools`: the request rendered tools
  // (without them a DSML block is content text).
  DeepseekAssembler(const DeepseekServing& serving, std::vector<std::string> stop, std::optional<uint64_t> call_id_seed,
                    bool tools);

  OutputDelta OnToken(int token, bool reasoning, const ContentLogprob* logprob = nullptr) override;
  OutputDelta Finish() override;
  bool StopMatched() const override { return answer_.stop_matched(); }
  const std::string& reasoning() const override { return reasoning_; }
  const std::string& content() const override { return answer_.text(); }
  const std::vector<AssembledToolCall>& tool_calls() const override { return calls_; }
  const std::vector<ContentLogprob>& content_logprobs() const override { return answer_.logprobs(); }
  int tool_call_parse_errors() const override { return parse_errors_; }

 private:
  void Content(std::string text, OutputDelta& out);
  // Reads what it can of the block; false when the block broke the format.
  bool ReadBlock(OutputDelta& out);
  void BlockAsText(OutputDelta& out);

  const DeepseekServing& serving_;
  const bool tools_;
  StopTrimmedContent answer_;  // content, stop strings, logprobs
  std::optional<std::mt19937_64> id_rng_;
  bool in_think_ = true, in_block_ = false, ended_ = false, finished_ = false;
  engine::Utf8StreamDecoder reasoning_decoder_, content_decoder_;
  std::string pending_;  // content held back: it may begin a block
  std::string block_;    // the block being read, after its opening
  std::string block_raw_;  // the whole block as written (returned as text if it breaks)
  size_t block_calls_ = 0;  // calls of this block already out
  std::string reasoning_;
  std::vector<AssembledToolCall> calls_;
  int parse_errors_ = 0;
};

}  // namespace moeserve::chat

// DeepSeek-V3.2's chat format as its published encoding defines it
// (encoding/encoding_dsv32.py of huggingface.co/deepseek-ai/DeepSeek-V3.2;
// read from a verbatim copy, github.com/cywinski/non-assistant-sampling
// src/mask/encoding_dsv32.py at commit ffe2c22f754160d80a844b4c2bfac99ceb88a679,
// since the model repository is not on GitHub): encode_messages with
// drop_thinking and the default BOS, in "thinking" or "chat" mode.
//
//   <｜begin▁of▁sentence｜>{system}[\n\n## Tools ... <functions>\n{tool}...\n</functions>\n]
//                          [\n\n## Response Format:\n\n...\n{response_format}]
//   per user:       <｜User｜>{content}<｜Assistant｜>  then <think> when it is the
//                   last user message in thinking mode, </think> otherwise
//   per assistant:  [{reasoning}</think>]{content}
//                   [\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="..">\n
//                    <｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>...
//                    \n</｜DSML｜invoke>...\n</｜DSML｜function_calls>]<｜end▁of▁sentence｜>
//                   (reasoning only after the last user message, in thinking mode,
//                   where such a turn must carry reasoning or calls)
//   tool results:   \n\n<function_results>\n<result>{content}</result>...\n</function_results>
//                   \n\n then <think> (thinking mode) or </think>; one block for the
//                   results of one assistant turn's calls, in order
// A string argument is written as is (string="true"), any other value as
// its JSON (to_json: Python's json.dumps with ensure_ascii off). The request's
// tools and response_format ride on the first message when it is a system
// message, else on an empty system message put first (as the published tests
// attach them to messages[0]). "developer" messages are system messages here
// (the API maps the role), so the encoding's developer form is never used.
//
// Tokens: BOS, EOS, <｜User｜>, <｜Assistant｜>, <think> and </think> are added
// tokens in DeepSeek-V3.2's tokenizer and become their ids; everything a
// client wrote stays text (chat_pieces.hpp), and so does the DSML markup,
// which the published tokenizer has no tokens for.
//
// Thread safety: free functions over values.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/chat_pieces.hpp"

namespace moeserve::engine {

struct DeepseekChatOptions {
  // "thinking" mode (the last user turn opens <think>) or "chat" mode.
  bool thinking = true;
  // The request's tools array ({"type":"function","function":{..}} elements); null or empty: none.
  const nlohmann::ordered_json* tools = nullptr;
  // The request's response_format object, rendered into the system message; null: none.
  const nlohmann::ordered_json* response_format = nullptr;
};

// The rendering, in pieces. Errors name the culprit ("messages[2]: ...", "tools[0]: ...").
Result<std::vector<ChatPiece>> RenderDeepseekChat(const std::vector<ChatMessage>& messages,
                                                  const DeepseekChatOptions& options);

// The DSML markup the format writes around calls (text, not tokens).
inline constexpr std::string_view kDsmlCallsOpen = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlCallsClose = "</｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvokeOpen = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlInvokeClose = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameterOpen = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParameterClose = "</｜DSML｜parameter>";

// One argument as the format writes it: `is_string` says string="true".
struct DsmlParameter {
  std::string name;
  bool is_string = false;
  std::string value;
};
// The arguments JSON the published decoder builds from a call's parameters
// (decode_dsml_to_arguments): {"k": <value as a JSON string when string="true",
// the text as written otherwise>, ...}.
std::string DsmlArgumentsJson(const std::vector<DsmlParameter>& parameters);

}  // namespace moeserve::engine

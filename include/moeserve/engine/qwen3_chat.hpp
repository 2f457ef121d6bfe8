// Qwen3-Next's chat format: ChatML with <think> reasoning and Hermes-style
// <tool_call> JSON, rendered as the published chat template renders it
// (Qwen3's tokenizer_config.json chat_template, which Qwen3-Next ships; the
// Thinking checkpoints' generation prompt opens the reasoning span):
//
//   [<|im_start|>system\n{system}[\n\n# Tools ... <tools>\n{tool}...\n</tools> ...]<|im_end|>\n]
//   per user:       <|im_start|>user\n{content}<|im_end|>\n
//   per assistant:  <|im_start|>assistant\n[<think>\n{reasoning}\n</think>\n\n]{content}
//                   [\n]<tool_call>\n{"name": "..", "arguments": {..}}\n</tool_call>...<|im_end|>\n
//   tool results:   <|im_start|>user[\n<tool_response>\n{content}\n</tool_response>]...<|im_end|>\n
//                   (consecutive tool messages share one user turn)
//   generation:     <|im_start|>assistant\n<think>\n
//
// As in the template, an assistant turn shows its reasoning only after the
// last real user query (tool-result turns do not count as queries), and
// reasoning written inline as `<think>..</think>` in content is split out.
// JSON in the prompt (tools, call arguments) is written as the template's
// `tojson` filter writes it under Hugging Face transformers: Python's
// json.dumps with ensure_ascii off and ", " / ": " separators, keys in the
// client's order (PythonJsonDumps). Call arguments are rendered as their
// JSON value (the client's text parsed once: ChatToolCall::arguments); text
// that was not JSON renders as that text.
//
// Tokens: the template's own markers (<|im_start|>, <|im_end|>, <think>,
// </think>, <tool_call>, </tool_call>, <tool_response>, </tool_response>)
// become their ids; everything a client wrote stays text (chat_pieces.hpp).
//
// Thread safety: free functions over values.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/chat_format.hpp"
#include "moeserve/engine/chat_pieces.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::engine {

// The rendering, in pieces. Errors name the culprit ("messages[2]: ...", "tools[0]: ...").
Result<std::vector<ChatPiece>> RenderQwen3Chat(const std::vector<ChatMessage>& messages,
                                               const nlohmann::ordered_json* tools, bool add_generation_prompt);

}  // namespace moeserve::engine

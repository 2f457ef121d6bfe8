#include "moeserve/engine/qwen3_chat.hpp"

#include <array>
#include <string_view>

#include "moeserve/common/json_limits.hpp"

namespace moeserve::engine {

namespace {

using ordered_json = nlohmann::ordered_json;

// The added tokens the template writes as literal text (tokenizer_config.json
// of Qwen3: all are added tokens, so Hugging Face encodes each as its id).
constexpr std::array<std::string_view, 8> kMarkers = {"<|im_start|>", "<|im_end|>",      "<think>",
                                                      "</think>",     "<tool_call>",     "</tool_call>",
                                                      "<tool_response>", "</tool_response>"};

// Python's str.strip/lstrip/rstrip of '\n'.
std::string_view LStripNewlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view RStripNewlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

std::string Ref(size_t i) { return "messages[" + std::to_string(i) + "]"; }

}  // namespace

Result<std::vector<ChatPiece>> RenderQwen3Chat(const std::vector<ChatMessage>& messages, const ordered_json* tools,
                                               bool add_generation_prompt) {
  if (tools != nullptr && !tools->is_null() && !tools->is_array())
    return Fail(Error::InvalidArgument("tools: must be an array").WithField("tools"));
  const bool has_tools = tools != nullptr && tools->is_array() && !tools->empty();
  if (has_tools) MOE_TRY(CheckJsonDepth(*tools, kChatJsonMaxDepth, "tools"));
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::kAssistant && (m.reasoning || !m.tool_calls.empty()))
      return Fail(Error::InvalidArgument(Ref(i) + ": only assistant messages carry reasoning or tool_calls").WithField(Ref(i)));
    for (size_t c = 0; c < m.tool_calls.size(); ++c)
      MOE_TRY(CheckJsonDepth(m.tool_calls[c].arguments, kChatJsonMaxDepth,
                             Ref(i) + ".tool_calls[" + std::to_string(c) + "].function.arguments"));
  }
  ChatPieceWriter w(kMarkers);
  const bool first_is_system = !messages.empty() && messages[0].role == ChatRole::kSystem;
  if (has_tools) {
    w.Template("<|im_start|>system\n");
    if (first_is_system) {
      w.Text(messages[0].content);
      w.Template("\n\n");
    }
    w.Template(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (const auto& tool : *tools) {
      w.Template("\n");
      w.Text(PythonJsonDumps(tool));
    }
    w.Template(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (first_is_system) {
    w.Template("<|im_start|>system\n");
    w.Text(messages[0].content);
    w.Template("<|im_end|>\n");
  }
  // The last real user query: reasoning shows only in assistant turns after it.
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == ChatRole::kUser &&
        !(StartsWith(m.content, "<tool_response>") && EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    switch (m.role) {
      case ChatRole::kUser:
      case ChatRole::kSystem:
        if (m.role == ChatRole::kSystem && i == 0) break;
        w.Template(m.role == ChatRole::kUser ? "<|im_start|>user\n" : "<|im_start|>system\n");
        w.Text(m.content);
        w.Template("<|im_end|>\n");
        break;
      case ChatRole::kAssistant: {
        std::string_view content = m.content;
        std::string_view reasoning;
        if (m.reasoning) {
          reasoning = *m.reasoning;
        } else if (size_t close = content.find("</think>"); close != std::string_view::npos) {
          // Python's split('</think>'): the text before the first and after the last.
          std::string_view before = RStripNewlines(content.substr(0, close));
          if (size_t open = before.rfind("<think>"); open != std::string_view::npos) before = before.substr(open + 7);
          reasoning = LStripNewlines(before);
          content = LStripNewlines(content.substr(content.rfind("</think>") + 8));
        }
        if (i > last_query && (last || !reasoning.empty())) {
          w.Template("<|im_start|>assistant\n<think>\n");
          w.Text(RStripNewlines(LStripNewlines(reasoning)));
          w.Template("\n</think>\n\n");
          w.Text(LStripNewlines(content));
        } else {
          w.Template("<|im_start|>assistant\n");
          w.Text(content);
        }
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          const ChatToolCall& call = m.tool_calls[c];
          if (c > 0 || !content.empty()) w.Template("\n");
          w.Template("<tool_call>\n{\"name\": \"");
          w.Text(call.name);
          w.Template("\", \"arguments\": ");
          w.Text(call.arguments.is_string() ? call.arguments.get<std::string>() : PythonJsonDumps(call.arguments));
          w.Template("}\n</tool_call>");
        }
        w.Template("<|im_end|>\n");
        break;
      }
      case ChatRole::kTool:
        if (i == 0 || messages[i - 1].role != ChatRole::kTool) w.Template("<|im_start|>user");
        w.Template("\n<tool_response>\n");
        w.Text(m.content);
        w.Template("\n</tool_response>");
        if (last || messages[i + 1].role != ChatRole::kTool) w.Template("<|im_end|>\n");
        break;
    }
  }
  if (add_generation_prompt) w.Template("<|im_start|>assistant\n<think>\n");
  return w.Take();
}

}  // namespace moeserve::engine

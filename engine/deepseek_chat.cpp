#include "moeserve/engine/deepseek_chat.hpp"

#include <array>
#include <string_view>

#include "moeserve/common/json_limits.hpp"

namespace moeserve::engine {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";

// The added tokens the encoding writes as literal text.
constexpr std::array<std::string_view, 6> kMarkers = {kBos, kEos, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"};

// TOOLS_SYSTEM_TEMPLATE around the tool schemas.
constexpr std::string_view kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your "
    "reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and "
    "objects should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters "
    "and \"false\" for other types (numbers, booleans, arrays, objects).\n\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
    "thinking block. Here is an example:\n\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n\n"
    "<think>...thinking about results</think>\n\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsTail = "\n</functions>\n";
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

std::string Ref(size_t i) { return "messages[" + std::to_string(i) + "]"; }

}  // namespace

std::string DsmlArgumentsJson(const std::vector<DsmlParameter>& parameters) {
  std::string out = "{";
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (i) out += ", ";
    out += PythonJsonDumps(ordered_json(parameters[i].name));
    out += ": ";
    out += parameters[i].is_string ? PythonJsonDumps(ordered_json(parameters[i].value)) : parameters[i].value;
  }
  return out + "}";
}

Result<std::vector<ChatPiece>> RenderDeepseekChat(const std::vector<ChatMessage>& messages,
                                                  const DeepseekChatOptions& options) {
  const ordered_json* tools = options.tools;
  if (tools != nullptr && !tools->is_null() && !tools->is_array())
    return Fail(Error::InvalidArgument("tools: must be an array").WithField("tools"));
  const bool has_tools = tools != nullptr && tools->is_array() && !tools->empty();
  if (has_tools) {
    MOE_TRY(CheckJsonDepth(*tools, kChatJsonMaxDepth, "tools"));
    for (size_t t = 0; t < tools->size(); ++t) {
      const ordered_json& tool = (*tools)[t];
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) {
        const std::string field = "tools[" + std::to_string(t) + "].function";
        return Fail(Error::InvalidArgument(field + ": must be an object").WithField(field));
      }
    }
  }
  const ordered_json* response_format =
      options.response_format != nullptr && !options.response_format->is_null() ? options.response_format : nullptr;
  if (response_format) MOE_TRY(CheckJsonDepth(*response_format, kChatJsonMaxDepth, "response_format"));

  // The last user message: what comes after it is the turn being answered.
  long last_user = -1;
  for (size_t k = messages.size(); k-- > 0;) {
    if (messages[k].role == ChatRole::kUser) {
      last_user = static_cast<long>(k);
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::kAssistant && (m.reasoning || !m.tool_calls.empty()))
      return Fail(Error::InvalidArgument(Ref(i) + ": only assistant messages carry reasoning or tool_calls").WithField(Ref(i)));
    if (!m.images.empty())
      return Fail(Error::InvalidArgument(Ref(i) + ": DeepSeek-V3.2 reads text only; image parts are not supported")
                      .WithField(Ref(i) + ".content"));
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      const std::string field = Ref(i) + ".tool_calls[" + std::to_string(c) + "].function.arguments";
      MOE_TRY(CheckJsonDepth(m.tool_calls[c].arguments, kChatJsonMaxDepth, field));
      if (!m.tool_calls[c].arguments.is_object())
        return Fail(Error::InvalidArgument(field + ": must be a JSON object (DeepSeek-V3.2 writes each argument as a "
                                                   "parameter)")
                        .WithField(field));
    }
    if (options.thinking && m.role == ChatRole::kAssistant && static_cast<long>(i) > last_user && !m.reasoning &&
        m.tool_calls.empty()) {
      return Fail(Error::InvalidArgument(Ref(i) +
                                         ": an assistant message after the last user message needs reasoning_content "
                                         "or tool_calls in thinking mode (DeepSeek-V3.2's encoding)")
                      .WithField(Ref(i)));
    }
  }

  ChatPieceWriter w(kMarkers);
  w.Template(kBos);
  auto system_extras = [&] {
    if (has_tools) {
      w.Template("\n\n");
      w.Template(kToolsHead);
      for (size_t t = 0; t < tools->size(); ++t) {
        if (t) w.Template("\n");
        w.Text(PythonJsonDumps((*tools)[t]["function"]));
      }
      w.Template(kToolsTail);
    }
    if (response_format) {
      w.Template("\n\n");
      w.Template(kResponseFormatHead);
      w.Text(PythonJsonDumps(*response_format));
    }
  };
  const bool first_is_system = !messages.empty() && messages[0].role == ChatRole::kSystem;
  if (!first_is_system && (has_tools || response_format)) system_extras();

  // The assistant turn whose calls the current run of tool messages answers.
  const ChatMessage* calling = nullptr;
  size_t results = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::kTool) {
      if (calling != nullptr && results < calling->tool_calls.size() && results > 0)
        return Fail(Error::InvalidArgument(Ref(i) + ": the assistant turn made " +
                                           std::to_string(calling->tool_calls.size()) + " calls but only " +
                                           std::to_string(results) + " tool results follow it")
                        .WithField(Ref(i)));
      calling = nullptr;
      results = 0;
    }
    switch (m.role) {
      case ChatRole::kSystem:
        w.Text(m.content);
        if (i == 0) system_extras();
        break;
      case ChatRole::kUser:
        w.Template("<｜User｜>");
        w.Text(m.content);
        w.Template("<｜Assistant｜>");
        w.Template(options.thinking && static_cast<long>(i) == last_user ? "<think>" : "</think>");
        break;
      case ChatRole::kAssistant: {
        if (options.thinking && static_cast<long>(i) > last_user) {
          w.Text(m.reasoning.value_or(""));
          w.Template("</think>");
        }
        w.Text(m.content);
        if (!m.tool_calls.empty()) {
          w.Template("\n\n");
          w.Template(kDsmlCallsOpen);
          w.Template("\n");
          for (size_t c = 0; c < m.tool_calls.size(); ++c) {
            const ChatToolCall& call = m.tool_calls[c];
            if (c) w.Template("\n");
            w.Template(kDsmlInvokeOpen);
            w.Text(call.name);
            w.Template("\">\n");
            bool first = true;
            for (auto it = call.arguments.begin(); it != call.arguments.end(); ++it) {
              if (!first) w.Template("\n");
              first = false;
              w.Template(kDsmlParameterOpen);
              w.Text(it.key());
              w.Template(it.value().is_string() ? "\" string=\"true\">" : "\" string=\"false\">");
              w.Text(it.value().is_string() ? it.value().get<std::string>() : PythonJsonDumps(it.value()));
              w.Template(kDsmlParameterClose);
            }
            w.Template("\n");
            w.Template(kDsmlInvokeClose);
          }
          w.Template("\n");
          w.Template(kDsmlCallsClose);
        }
        w.Template(kEos);
        if (!m.tool_calls.empty()) calling = &m;
        break;
      }
      case ChatRole::kTool: {
        if (calling == nullptr || results >= calling->tool_calls.size())
          return Fail(Error::InvalidArgument(Ref(i) + ": a tool result must answer a call of the assistant message "
                                                      "before it (one result per call, in order)")
                          .WithField(Ref(i)));
        if (results == 0) w.Template("\n\n<function_results>");
        w.Template("\n<result>");
        w.Text(m.content);
        w.Template("</result>");
        ++results;
        if (results == calling->tool_calls.size()) {
          w.Template("\n</function_results>\n\n");
          w.Template(options.thinking && static_cast<long>(i) >= last_user ? "<think>" : "</think>");
        }
        break;
      }
    }
  }
  if (calling != nullptr && results > 0 && results < calling->tool_calls.size())
    return Fail(Error::InvalidArgument("messages: the last assistant turn made " +
                                       std::to_string(calling->tool_calls.size()) + " calls but only " +
                                       std::to_string(results) + " tool results follow it")
                    .WithField("messages"));
  return w.Take();
}

}  // namespace moeserve::engine

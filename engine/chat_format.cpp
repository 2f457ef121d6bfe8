#include "moeserve/engine/chat_format.hpp"

#include <cstdint>

#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::engine {

namespace {

using ordered_json = nlohmann::ordered_json;

// Compact, ensure_ascii off: the one serialiser of every JSON byte in a prompt
// (the escaping rules are in the header). dump() throws on invalid UTF-8;
// that is the caller's input, so it becomes an error naming the field.
Result<std::string> Dump(const ordered_json& value, std::string_view what) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    return Fail(Error::InvalidArgument(std::string(what) + ": cannot be written as JSON (" + e.what() + ")")
                    .WithField(std::string(what)));
  }
}

// Token ids under construction; text goes in as bytes, so nothing a client
// writes can become a special id.
class TokenWriter {
 public:
  void Special(int id) { ids_.push_back(id); }
  void Text(std::string_view text) {
    for (char c : text) ids_.push_back(static_cast<unsigned char>(c));
  }
  // An image's span (vision.hpp), recorded with its offset.
  Status Image(const VisionConfig& v, const ImageInput& image) { return AppendImage(v, image, ids_, images_); }
  std::vector<int> Take() { return std::move(ids_); }
  std::vector<ImageSpan> TakeImages() { return std::move(images_); }

 private:
  std::vector<int> ids_;
  std::vector<ImageSpan> images_;
};

std::string MessageRef(size_t i) { return "messages[" + std::to_string(i) + "]"; }

// Generated spans are bounded by the token budget, not by bytes; their depth
// and keys per object need a limit.
constexpr JsonLimits kGeneratedJsonLimits{
    .max_bytes = SIZE_MAX, .max_depth = kChatJsonMaxDepth, .max_object_keys = kChatJsonMaxObjectKeys};

// A valid JSON text within the limits, or nullopt: for generated text, where
// anything else is "returned as generated".
std::optional<ordered_json> ParseGenerated(std::string_view text) {
  if (FindJsonLimitViolation(text, kGeneratedJsonLimits)) return std::nullopt;
  ordered_json value = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// The prompt's tools JSON: the array of the request's tools[].function objects.
Result<std::optional<std::string>> RenderTools(const ordered_json* tools) {
  if (tools == nullptr || tools->is_null()) return std::nullopt;
  if (!tools->is_array()) return Fail(Error::InvalidArgument("tools: must be an array").WithField("tools"));
  if (tools->empty()) return std::nullopt;
  MOE_TRY(CheckJsonDepth(*tools, kChatJsonMaxDepth, "tools"));
  ordered_json functions = ordered_json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const ordered_json& tool = (*tools)[i];
    std::string where = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) {
      return Fail(Error::InvalidArgument(where + ": expected {\"type\":\"function\",\"function\":{...}}").WithField(where));
    }
    if (tool.contains("type") && tool["type"] != "function") {
      return Fail(Error::InvalidArgument(where + ".type: only \"function\" tools are supported, got " +
                                         tool["type"].dump())
                      .WithField(where + ".type"));
    }
    functions.push_back(tool["function"]);
  }
  MOE_ASSIGN_OR_RETURN(std::string text, Dump(functions, "tools"));
  return text;
}

Status CheckFieldsMatchRole(const ChatMessage& m, size_t i) {
  if (m.role != ChatRole::kAssistant && m.reasoning) {
    return Fail(Error::InvalidArgument(MessageRef(i) + ": only assistant messages carry reasoning").WithField(MessageRef(i)));
  }
  if (m.role != ChatRole::kAssistant && !m.tool_calls.empty()) {
    return Fail(Error::InvalidArgument(MessageRef(i) + ": only assistant messages carry tool_calls").WithField(MessageRef(i)));
  }
  if (m.role != ChatRole::kTool && !m.tool_call_id.empty()) {
    return Fail(Error::InvalidArgument(MessageRef(i) + ": only tool messages carry tool_call_id").WithField(MessageRef(i)));
  }
  if (m.role != ChatRole::kUser && m.role != ChatRole::kTool && !m.images.empty()) {
    return Fail(Error::InvalidArgument(MessageRef(i) + ": only user and tool messages carry images").WithField(MessageRef(i)));
  }
  for (size_t k = 0; k < m.images.size(); ++k) {
    if (m.role == ChatRole::kUser &&
        (m.images[k].at > m.content.size() || (k > 0 && m.images[k].at < m.images[k - 1].at))) {
      return Fail(Error::InvalidArgument(MessageRef(i) + ": image " + std::to_string(k) +
                                         " is placed outside the content or before the previous image")
                      .WithField(MessageRef(i)));
    }
  }
  return Ok();
}

// A user message's content with its images in place.
Status WriteUserContent(TokenWriter& out, const ChatMessage& m, const VisionConfig& v, size_t i) {
  size_t done = 0;
  for (size_t k = 0; k < m.images.size(); ++k) {
    out.Text(std::string_view(m.content).substr(done, m.images[k].at - done));
    done = m.images[k].at;
    if (auto st = out.Image(v, m.images[k].image); !st)
      return Fail(st.error().WithContext(MessageRef(i) + ".image " + std::to_string(k)).WithField(MessageRef(i)));
  }
  out.Text(std::string_view(m.content).substr(done));
  return Ok();
}

// ---- reading a generated span --------------------------------------------------

// A small cursor over the span text for the fixed shape the renderer writes.
class SpanReader {
 public:
  explicit SpanReader(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // A JSON string literal, decoded.
  std::optional<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || text_[pos_] != '"') return std::nullopt;
    size_t end = pos_ + 1;
    while (end < text_.size() && text_[end] != '"') end += text_[end] == '\\' ? 2 : 1;
    if (end >= text_.size()) return std::nullopt;
    std::optional<ordered_json> value = ParseGenerated(text_.substr(pos_, end + 1 - pos_));
    if (!value || !value->is_string()) return std::nullopt;
    pos_ = end + 1;
    return value->get<std::string>();
  }
  bool Key(std::string_view name) {
    std::optional<std::string> key = String();
    return key && *key == name && Consume(':');
  }
  std::string_view Rest() const { return text_.substr(pos_); }

  static bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && SpanReader::IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && SpanReader::IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

void SetArguments(ParsedToolCall& call, std::string_view text) {
  call.arguments_text = std::string(text);
  std::optional<ordered_json> value = ParseGenerated(text);
  call.arguments_valid_json = value.has_value();
  call.arguments_is_object = value && value->is_object();
}

// The rendered shape, read by position so the arguments come back byte for
// byte as generated, valid or not.
std::optional<ParsedToolCall> ReadInRenderedOrder(std::string_view text) {
  SpanReader r(text);
  ParsedToolCall call;
  if (!r.Consume('{') || !r.Key("id")) return std::nullopt;
  std::optional<std::string> id = r.String();
  if (!id || !r.Consume(',') || !r.Key("name")) return std::nullopt;
  std::optional<std::string> name = r.String();
  if (!name || !r.Consume(',') || !r.Key("arguments")) return std::nullopt;
  call.id = std::move(*id);
  call.name = std::move(*name);

  std::string_view rest = Trim(r.Rest());
  if (!rest.empty() && rest.back() == '}') {
    std::string_view inside = Trim(rest.substr(0, rest.size() - 1));
    SetArguments(call, inside);
    if (call.arguments_valid_json) return call;
    // The last brace may close the arguments themselves when the span's own
    // closing brace was never generated (generation cut short).
    ParsedToolCall whole = call;
    SetArguments(whole, rest);
    if (whole.arguments_valid_json) return whole;
    return call;
  }
  SetArguments(call, rest);
  return call;
}

}  // namespace

Result<ChatRole> ParseChatRole(std::string_view role) {
  if (role == "system" || role == "developer") return ChatRole::kSystem;
  if (role == "user") return ChatRole::kUser;
  if (role == "assistant") return ChatRole::kAssistant;
  if (role == "tool") return ChatRole::kTool;
  return Fail(Error::InvalidArgument("unknown role '" + std::string(role) +
                                     "' (expected system, developer, user, assistant or tool)"));
}

std::string_view ChatRoleName(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "assistant";
    case ChatRole::kTool: return "tool";
  }
  return "unknown";
}

Result<ordered_json> ToolCallArgumentsFromText(std::string_view text, const JsonLimits& limits,
                                               std::string_view what) {
  if (auto v = FindJsonLimitViolation(text, limits)) {
    return Fail(Error::InvalidArgument(std::string(what) + ": " + v->message).WithField(std::string(what)));
  }
  ordered_json value = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return ordered_json(std::string(text));
  return value;
}

Result<std::string> RenderToolCallJson(const ChatToolCall& call) {
  // The span is assembled from three dumps rather than dumped as one object so
  // the arguments are not copied; the bytes are the same as the object's dump.
  MOE_TRY(CheckJsonDepth(call.arguments, kChatJsonMaxDepth, "arguments"));
  std::string what = "tool call '" + call.id + "'";
  MOE_ASSIGN_OR_RETURN(std::string id, Dump(ordered_json(call.id), what));
  MOE_ASSIGN_OR_RETURN(std::string name, Dump(ordered_json(call.name), what));
  MOE_ASSIGN_OR_RETURN(std::string arguments, Dump(call.arguments, what));
  return "{\"id\":" + id + ",\"name\":" + name + ",\"arguments\":" + arguments + "}";
}

std::string ToolCallSpanIdPrefix(std::string_view id) {
  ordered_json id_json = std::string(id);
  // Ids are ours (ASCII); replacement only guards against a caller's bug.
  return "{\"id\":" + id_json.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + ",";
}

Result<std::vector<int>> RenderChat(const std::vector<ChatMessage>& messages, const ordered_json* tools,
                                    bool add_generation_prompt) {
  MOE_ASSIGN_OR_RETURN(RenderedChat r, RenderChatWithImages(messages, tools, add_generation_prompt, nullptr));
  return std::move(r.tokens);
}

Result<RenderedChat> RenderChatWithImages(const std::vector<ChatMessage>& messages, const ordered_json* tools,
                                          bool add_generation_prompt, const VisionConfig* vision) {
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].images.empty() && !vision)
      return Fail(Error::InvalidArgument(MessageRef(i) + ": image input needs a model with a vision tower")
                      .WithField(MessageRef(i)));
  TokenWriter out;
  out.Special(tok::kBos);

  // 1. The system block: leading system messages joined, plus the tools.
  std::string system;
  size_t first_turn = 0;
  for (; first_turn < messages.size() && messages[first_turn].role == ChatRole::kSystem; ++first_turn) {
    MOE_TRY(CheckFieldsMatchRole(messages[first_turn], first_turn));
    if (first_turn > 0) system += "\n";
    system += messages[first_turn].content;
  }
  MOE_ASSIGN_OR_RETURN(std::optional<std::string> tools_json, RenderTools(tools));
  if (!system.empty() || tools_json) {
    out.Special(tok::kSystem);
    out.Text(system);
    if (tools_json) {
      out.Special(tok::kTools);
      out.Text(*tools_json);
    }
    out.Special(tok::kEnd);
  }

  // 2. The turns, in order.
  for (size_t i = first_turn; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    MOE_TRY(CheckFieldsMatchRole(m, i));
    switch (m.role) {
      case ChatRole::kSystem:
        return Fail(Error::InvalidArgument(MessageRef(i) +
                                           ": a system message must come before all user, assistant and tool "
                                           "messages (the format has one system block, at the start)")
                        .WithField(MessageRef(i)));
      case ChatRole::kUser:
        out.Special(tok::kUser);
        if (m.images.empty()) {
          out.Text(m.content);
        } else {
          MOE_TRY(WriteUserContent(out, m, *vision, i));
        }
        out.Special(tok::kEnd);
        break;
      case ChatRole::kAssistant:
        out.Special(tok::kAssistant);
        out.Special(tok::kThink);
        out.Text(m.reasoning.value_or(""));
        out.Special(tok::kEndThink);
        out.Text(m.content);
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          auto span = RenderToolCallJson(m.tool_calls[c]);
          if (!span) {
            const std::string where = MessageRef(i) + ".tool_calls[" + std::to_string(c) + "]";
            return Fail(span.error().WithContext(where).WithField(where));
          }
          out.Special(tok::kToolCall);
          out.Text(*span);
          out.Special(tok::kEndToolCall);
        }
        out.Special(tok::kEnd);
        break;
      case ChatRole::kTool: {
        ordered_json result = ordered_json::object();
        result["tool_call_id"] = m.tool_call_id;
        result["content"] = m.content;
        MOE_ASSIGN_OR_RETURN(std::string text, Dump(result, MessageRef(i)));
        out.Special(tok::kTool);
        out.Text(text);
        for (size_t k = 0; k < m.images.size(); ++k)  // an agent's screenshot tool: images after the result
          if (auto st = out.Image(*vision, m.images[k].image); !st)
            return Fail(st.error().WithContext(MessageRef(i) + ".image " + std::to_string(k)).WithField(MessageRef(i)));
        out.Special(tok::kEnd);
        break;
      }
    }
  }

  // 3. Generation starts inside the thinking span.
  if (add_generation_prompt) {
    out.Special(tok::kAssistant);
    out.Special(tok::kThink);
  }
  RenderedChat r;
  r.images = out.TakeImages();
  r.tokens = out.Take();
  return r;
}

Result<ParsedToolCall> ParseToolCallSpan(std::string_view text) {
  std::optional<ParsedToolCall> in_order = ReadInRenderedOrder(text);
  if (in_order && in_order->arguments_valid_json) return *in_order;

  // Not the rendered shape, or arguments that do not parse: a full parse
  // still reads an object whose keys come in another order.
  ordered_json whole = ParseGenerated(text).value_or(ordered_json());
  if (whole.is_object() && whole.contains("id") && whole["id"].is_string() &&
      whole.contains("name") && whole["name"].is_string() && whole.contains("arguments")) {
    ParsedToolCall call;
    call.id = whole["id"].get<std::string>();
    call.name = whole["name"].get<std::string>();
    call.arguments_text = whole["arguments"].dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    call.arguments_valid_json = true;
    call.arguments_is_object = whole["arguments"].is_object();
    return call;
  }
  if (in_order) return *in_order;  // id and name found; arguments returned as generated
  return Fail(Error::InvalidArgument(
      "tool call span: expected {\"id\":\"...\",\"name\":\"...\",\"arguments\":...}, got '" +
      std::string(text.substr(0, 200)) + (text.size() > 200 ? "...'" : "'")));
}

std::string NewToolCallId() {
  thread_local std::mt19937_64 rng = [] {
    std::random_device device;
    std::seed_seq seed{device(), device(), device(), device(), device(), device(), device(), device()};
    return std::mt19937_64(seed);
  }();
  return NewToolCallId(rng);
}

}  // namespace moeserve::engine

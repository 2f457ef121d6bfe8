#include "moeserve/daemon/responses/response_request.hpp"

#include "moeserve/common/json_limits.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {

ApiError Bad(const std::string& param, const std::string& message) {
  return ApiError::InvalidRequest("'" + param + "': " + message, param);
}

std::string TypeName(const ojson& v) { return v.is_null() ? "null" : v.type_name(); }

ApiResult<std::string> String(const ojson& v, const std::string& param) {
  if (!v.is_string()) return ApiFail(Bad(param, "expected a string, got " + TypeName(v)));
  return v.get<std::string>();
}

ApiResult<std::string> NonEmptyString(const ojson& v, const std::string& param) {
  auto s = String(v, param);
  if (s && s->empty()) return ApiFail(Bad(param, "must not be empty"));
  return s;
}

// A message's content as chat content: a string, or an array of parts
// (input_text, output_text; refusal text is kept as text). Text parts are
// joined into one string unless `images_allowed` and an input_image part is
// present; then the chat parts come back in order (text and image_url), so
// that chat's param "content[j]" is the request's "content[j]" too.
ApiResult<ojson> ChatContent(const ojson& content, const std::string& param, bool images_allowed) {
  if (content.is_string()) return ojson(content.get<std::string>());
  if (!content.is_array()) return ApiFail(Bad(param, "expected a string or an array of content parts, got " + TypeName(content)));
  if (content.size() > kMaxResponseContentParts) {
    return ApiFail(Bad(param, "has " + std::to_string(content.size()) + " parts, more than " +
                                  std::to_string(kMaxResponseContentParts)));
  }
  std::string text;
  ojson parts = ojson::array();
  bool images = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string p = param + "[" + std::to_string(j) + "]";
    const ojson& part = content[j];
    if (!part.is_object()) return ApiFail(Bad(p, "expected a content part object, got " + TypeName(part)));
    if (!part.contains("type")) return ApiFail(Bad(p + ".type", "is required"));
    auto type = String(part["type"], p + ".type");
    if (!type) return ApiFail(type.error());
    std::string piece;
    if (*type == "input_text" || *type == "output_text" || *type == "text") {
      if (!part.contains("text")) return ApiFail(Bad(p + ".text", "is required"));
      auto t = String(part["text"], p + ".text");
      if (!t) return ApiFail(t.error());
      piece = std::move(*t);
    } else if (*type == "refusal") {
      auto t = String(part.value("refusal", ojson()), p + ".refusal");
      if (!t) return ApiFail(t.error());
      piece = std::move(*t);
    } else if (*type == "input_image") {
      if (!images_allowed)
        return ApiFail(Bad(p + ".type", "input_image parts are accepted in user messages and function_call_output "
                                        "only"));
      if (part.contains("file_id") && !part["file_id"].is_null())
        return ApiFail(Bad(p + ".file_id", "file ids are not supported on this server; send image_url as a data: URL"));
      auto url = NonEmptyString(part.value("image_url", ojson()), p + ".image_url");
      if (!url) return ApiFail(url.error());
      ojson image = {{"url", *url}};
      if (part.contains("detail") && !part["detail"].is_null()) {
        const ojson& d = part["detail"];
        if (!d.is_string() || (d != "low" && d != "high" && d != "auto"))
          return ApiFail(Bad(p + ".detail", "must be \"low\", \"high\" or \"auto\""));
        image["detail"] = d;
      }
      parts.push_back({{"type", "image_url"}, {"image_url", std::move(image)}});
      images = true;
      continue;
    } else if (*type == "input_file" || *type == "input_audio") {
      return ApiFail(Bad(p + ".type", "'" + *type + "' parts are not supported on this server; send text and "
                                                    "input_image parts"));
    } else {
      return ApiFail(Bad(p + ".type", "unknown content part type '" + *type +
                                          "' (expected input_text, output_text or input_image)"));
    }
    text += piece;
    parts.push_back({{"type", "text"}, {"text", std::move(piece)}});
  }
  if (images) return parts;
  return ojson(std::move(text));
}

// Builds the chat messages of `input` item by item. Function calls join the
// assistant message before them (one message, several tool_calls, as chat
// completions has it); a reasoning item's summary becomes the
// reasoning_content of the assistant message that follows it.
class MessageBuilder {
 public:
  MessageBuilder(ojson& messages, std::vector<std::string>& params) : messages_(messages), params_(params) {}

  ApiResult<void> Item(const ojson& item, const std::string& p) {
    if (!item.is_object()) return ApiFail(Bad(p, "expected an input item object, got " + TypeName(item)));
    std::string type = "message";  // EasyInputMessage has no type
    if (item.contains("type")) {
      auto t = String(item["type"], p + ".type");
      if (!t) return ApiFail(t.error());
      type = *t;
    }
    if (type == "message") return Message(item, p);
    if (type == "function_call") return FunctionCall(item, p);
    if (type == "function_call_output") return FunctionCallOutput(item, p);
    if (type == "reasoning") return Reasoning(item, p);
    if (type == "item_reference")
      return ApiFail(Bad(p + ".type", "item_reference items are not supported; continue with previous_response_id"));
    return ApiFail(Bad(p + ".type", "'" + type +
                                        "' items are not supported (message, function_call, "
                                        "function_call_output and reasoning are)"));
  }

  ApiResult<void> Finish(const std::string& p) {
    if (!reasoning_.empty()) return ApiFail(Bad(p, "a reasoning item must be followed by an assistant message or function_call"));
    return {};
  }

 private:
  ApiResult<void> Message(const ojson& item, const std::string& p) {
    if (!item.contains("role")) return ApiFail(Bad(p + ".role", "is required"));
    auto role = String(item["role"], p + ".role");
    if (!role) return ApiFail(role.error());
    if (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer")
      return ApiFail(Bad(p + ".role", "must be user, assistant, system or developer (got '" + *role + "')"));
    if (!item.contains("content")) return ApiFail(Bad(p + ".content", "is required"));
    auto text = ChatContent(item["content"], p + ".content", *role == "user");
    if (!text) return ApiFail(text.error());
    if (*role == "assistant") {
      ojson m = {{"role", "assistant"}, {"content", *text}};
      TakeReasoning(m);
      Push(std::move(m), p);
      open_assistant_ = true;
      return {};
    }
    if (!reasoning_.empty()) return ApiFail(Bad(p, "a reasoning item must be followed by an assistant message or function_call"));
    Push({{"role", *role == "developer" ? "system" : *role}, {"content", *text}}, p);
    open_assistant_ = false;
    return {};
  }

  ApiResult<void> FunctionCall(const ojson& item, const std::string& p) {
    auto call_id = NonEmptyString(item.value("call_id", ojson()), p + ".call_id");
    if (!call_id) return ApiFail(call_id.error());
    auto name = NonEmptyString(item.value("name", ojson()), p + ".name");
    if (!name) return ApiFail(name.error());
    auto arguments = String(item.value("arguments", ojson()), p + ".arguments");
    if (!arguments) return ApiFail(arguments.error());
    ojson call = {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *arguments}}}};
    if (!open_assistant_ || !reasoning_.empty()) {
      ojson m = {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array()}};
      TakeReasoning(m);
      Push(std::move(m), p);
      open_assistant_ = true;
    }
    ojson& m = messages_.back();
    if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
    m["tool_calls"].push_back(std::move(call));
    return {};
  }

  ApiResult<void> FunctionCallOutput(const ojson& item, const std::string& p) {
    if (!reasoning_.empty()) return ApiFail(Bad(p, "a reasoning item must be followed by an assistant message or function_call"));
    auto call_id = NonEmptyString(item.value("call_id", ojson()), p + ".call_id");
    if (!call_id) return ApiFail(call_id.error());
    if (!item.contains("output")) return ApiFail(Bad(p + ".output", "is required"));
    auto output = ChatContent(item["output"], p + ".output", /*images_allowed=*/true);
    if (!output) return ApiFail(output.error());
    Push({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", *output}}, p);
    open_assistant_ = false;
    return {};
  }

  ApiResult<void> Reasoning(const ojson& item, const std::string& p) {
    const ojson summary = item.value("summary", ojson::array());
    if (!summary.is_array()) return ApiFail(Bad(p + ".summary", "expected an array, got " + TypeName(summary)));
    if (summary.size() > kMaxResponseContentParts)
      return ApiFail(Bad(p + ".summary", "has more than " + std::to_string(kMaxResponseContentParts) + " parts"));
    for (size_t j = 0; j < summary.size(); ++j) {
      const std::string sp = p + ".summary[" + std::to_string(j) + "]";
      if (!summary[j].is_object()) return ApiFail(Bad(sp, "expected a summary_text object, got " + TypeName(summary[j])));
      auto text = String(summary[j].value("text", ojson()), sp + ".text");
      if (!text) return ApiFail(text.error());
      reasoning_ += *text;
    }
    // A reasoning item starts a new assistant turn.
    open_assistant_ = false;
    if (reasoning_.empty()) reasoning_pending_ = true;
    return {};
  }

  void TakeReasoning(ojson& m) {
    if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
    reasoning_.clear();
    reasoning_pending_ = false;
  }

  void Push(ojson m, const std::string& p) {
    messages_.push_back(std::move(m));
    params_.push_back(p);
  }

  ojson& messages_;
  std::vector<std::string>& params_;
  std::string reasoning_;
  bool reasoning_pending_ = false;
  bool open_assistant_ = false;
};

ApiResult<ojson> FunctionTool(const ojson& tool, const std::string& p) {
  if (!tool.is_object()) return ApiFail(Bad(p, "expected a tool object, got " + TypeName(tool)));
  if (!tool.contains("type")) return ApiFail(Bad(p + ".type", "is required"));
  auto type = String(tool["type"], p + ".type");
  if (!type) return ApiFail(type.error());
  if (*type != "function") {
    return ApiFail(Bad(p + ".type", "built-in tool '" + *type +
                                        "' is not supported on this server; only function tools are"));
  }
  auto name = NonEmptyString(tool.value("name", ojson()), p + ".name");
  if (!name) return ApiFail(name.error());
  ojson out = {{"type", "function"}, {"name", *name}};
  if (tool.contains("description") && !tool["description"].is_null()) {
    auto d = String(tool["description"], p + ".description");
    if (!d) return ApiFail(d.error());
    out["description"] = *d;
  }
  ojson parameters = ojson::object();
  if (tool.contains("parameters") && !tool["parameters"].is_null()) {
    if (!tool["parameters"].is_object())
      return ApiFail(Bad(p + ".parameters", "expected a JSON schema object, got " + TypeName(tool["parameters"])));
    parameters = tool["parameters"];
  }
  out["parameters"] = parameters;
  bool strict = false;
  if (tool.contains("strict") && !tool["strict"].is_null()) {
    if (!tool["strict"].is_boolean()) return ApiFail(Bad(p + ".strict", "expected a boolean, got " + TypeName(tool["strict"])));
    strict = tool["strict"].get<bool>();
  }
  out["strict"] = strict;
  return out;
}

ApiResult<ojson> ToolChoice(const ojson& v, const ojson& tools) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto" || s == "none" || s == "required") return v;
    return ApiFail(Bad("tool_choice", "must be auto, none, required or {\"type\":\"function\",\"name\":...} (got '" + s + "')"));
  }
  if (!v.is_object()) return ApiFail(Bad("tool_choice", "expected a string or an object, got " + TypeName(v)));
  auto type = String(v.value("type", ojson()), "tool_choice.type");
  if (!type) return ApiFail(type.error());
  if (*type != "function")
    return ApiFail(Bad("tool_choice.type", "'" + *type + "' is not supported; only function tools are"));
  auto name = NonEmptyString(v.value("name", ojson()), "tool_choice.name");
  if (!name) return ApiFail(name.error());
  for (const auto& t : tools)
    if (t["name"] == *name) return ojson{{"type", "function"}, {"name", *name}};
  return ApiFail(Bad("tool_choice.name", "names no function in tools ('" + *name + "')"));
}

ApiResult<ojson> TextFormat(const ojson& text) {
  if (!text.is_object()) return ApiFail(Bad("text", "expected an object, got " + TypeName(text)));
  if (!text.contains("format") || text["format"].is_null()) return ojson{{"type", "text"}};
  const ojson& f = text["format"];
  if (!f.is_object()) return ApiFail(Bad("text.format", "expected an object, got " + TypeName(f)));
  auto type = String(f.value("type", ojson()), "text.format.type");
  if (!type) return ApiFail(type.error());
  if (*type == "text" || *type == "json_object") return ojson{{"type", *type}};
  if (*type != "json_schema")
    return ApiFail(Bad("text.format.type", "must be text, json_object or json_schema (got '" + *type + "')"));
  auto name = NonEmptyString(f.value("name", ojson()), "text.format.name");
  if (!name) return ApiFail(name.error());
  if (!f.contains("schema") || !f["schema"].is_object())
    return ApiFail(Bad("text.format.schema", "is required and must be a JSON schema object"));
  ojson out = {{"type", "json_schema"}, {"name", *name}, {"schema", f["schema"]}};
  if (f.contains("description") && !f["description"].is_null()) {
    auto d = String(f["description"], "text.format.description");
    if (!d) return ApiFail(d.error());
    out["description"] = *d;
  }
  bool strict = false;
  if (f.contains("strict") && !f["strict"].is_null()) {
    if (!f["strict"].is_boolean()) return ApiFail(Bad("text.format.strict", "expected a boolean, got " + TypeName(f["strict"])));
    strict = f["strict"].get<bool>();
  }
  out["strict"] = strict;
  return out;
}

ApiResult<bool> Bool(const ojson& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) return ApiFail(Bad(key, "expected a boolean, got " + TypeName(body[key])));
  return body[key].get<bool>();
}

ApiResult<std::optional<double>> Number(const ojson& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::optional<double>();
  if (!body[key].is_number()) return ApiFail(Bad(key, "expected a number, got " + TypeName(body[key])));
  return std::optional<double>(body[key].get<double>());
}

ApiResult<ResponsesRequest> Read(const ojson& body) {
  if (!body.is_object()) return ApiFail(ApiError::InvalidRequest("The request body must be a JSON object, got " + TypeName(body)));
  ResponsesRequest r;
  if (body.contains("model") && !body["model"].is_null()) {
    auto m = String(body["model"], "model");
    if (!m) return ApiFail(m.error());
    r.model = *m;
  }
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    auto s = String(body["instructions"], "instructions");
    if (!s) return ApiFail(s.error());
    r.instructions = *s;
  }
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    auto s = NonEmptyString(body["previous_response_id"], "previous_response_id");
    if (!s) return ApiFail(s.error());
    if (s->size() > 128) return ApiFail(Bad("previous_response_id", "is longer than 128 characters"));
    r.previous_response_id = *s;
  }
  // input: a string (one user message) or items.
  if (!body.contains("input") || body["input"].is_null()) return ApiFail(Bad("input", "is required"));
  const ojson& input = body["input"];
  if (input.is_string()) {
    r.messages.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    r.message_params.push_back("input");
  } else if (input.is_array()) {
    if (input.size() > kMaxResponseInputItems) {
      return ApiFail(Bad("input", "has " + std::to_string(input.size()) + " items, more than " +
                                      std::to_string(kMaxResponseInputItems)));
    }
    if (input.empty() && !r.previous_response_id) return ApiFail(Bad("input", "must not be empty"));
    MessageBuilder builder(r.messages, r.message_params);
    for (size_t i = 0; i < input.size(); ++i) {
      if (auto ok = builder.Item(input[i], "input[" + std::to_string(i) + "]"); !ok) return ApiFail(ok.error());
    }
    if (auto ok = builder.Finish("input[" + std::to_string(input.size() - 1) + "]"); !ok) return ApiFail(ok.error());
  } else {
    return ApiFail(Bad("input", "expected a string or an array of input items, got " + TypeName(input)));
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) return ApiFail(Bad("tools", "expected an array, got " + TypeName(tools)));
    if (tools.size() > kMaxResponseTools)
      return ApiFail(Bad("tools", "has " + std::to_string(tools.size()) + " tools, more than " + std::to_string(kMaxResponseTools)));
    for (size_t i = 0; i < tools.size(); ++i) {
      auto t = FunctionTool(tools[i], "tools[" + std::to_string(i) + "]");
      if (!t) return ApiFail(t.error());
      for (const auto& earlier : r.tools) {
        if (earlier["name"] == (*t)["name"])
          return ApiFail(Bad("tools[" + std::to_string(i) + "].name", "repeats the name of an earlier tool"));
      }
      r.tools.push_back(std::move(*t));
    }
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    auto c = ToolChoice(body["tool_choice"], r.tools);
    if (!c) return ApiFail(c.error());
    r.tool_choice = std::move(*c);
  }
  auto parallel = Bool(body, "parallel_tool_calls", true);
  if (!parallel) return ApiFail(parallel.error());
  r.parallel_tool_calls = *parallel;
  if (body.contains("reasoning") && !body["reasoning"].is_null()) {
    const ojson& reasoning = body["reasoning"];
    if (!reasoning.is_object()) return ApiFail(Bad("reasoning", "expected an object, got " + TypeName(reasoning)));
    if (reasoning.contains("effort") && !reasoning["effort"].is_null()) {
      auto e = String(reasoning["effort"], "reasoning.effort");
      if (!e) return ApiFail(e.error());
      if (*e == "minimal") *e = "low";
      if (*e != "low" && *e != "medium" && *e != "high")
        return ApiFail(Bad("reasoning.effort", "must be minimal, low, medium or high (got '" + *e + "')"));
      r.effort = *e;
    }
  }
  if (body.contains("max_output_tokens") && !body["max_output_tokens"].is_null()) {
    const ojson& m = body["max_output_tokens"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > (int64_t{1} << 30))
      return ApiFail(Bad("max_output_tokens", "expected a positive integer"));
    r.max_output_tokens = m.get<int64_t>();
  }
  auto temperature = Number(body, "temperature");
  if (!temperature) return ApiFail(temperature.error());
  r.temperature = *temperature;
  auto top_p = Number(body, "top_p");
  if (!top_p) return ApiFail(top_p.error());
  r.top_p = *top_p;
  if (body.contains("text") && !body["text"].is_null()) {
    auto f = TextFormat(body["text"]);
    if (!f) return ApiFail(f.error());
    r.text_format = std::move(*f);
  }
  auto store = Bool(body, "store", true);
  if (!store) return ApiFail(store.error());
  r.store = *store;
  auto stream = Bool(body, "stream", false);
  if (!stream) return ApiFail(stream.error());
  r.stream = *stream;
  auto background = Bool(body, "background", false);
  if (!background) return ApiFail(background.error());
  r.background = *background;
  if (r.background && !r.store) return ApiFail(Bad("background", "a background response must be stored (store: true)"));
  if (r.background && r.stream)
    return ApiFail(Bad("stream", "streaming a background response is not supported; poll GET /v1/responses/{id}"));
  if (body.contains("truncation") && !body["truncation"].is_null()) {
    auto t = String(body["truncation"], "truncation");
    if (!t) return ApiFail(t.error());
    if (*t != "disabled")
      return ApiFail(Bad("truncation", "only 'disabled' is supported (a conversation longer than the context is refused)"));
  }
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    const ojson& m = body["metadata"];
    if (!m.is_object()) return ApiFail(Bad("metadata", "expected an object, got " + TypeName(m)));
    if (m.size() > 16) return ApiFail(Bad("metadata", "has more than 16 keys"));
    for (const auto& [k, v] : m.items()) {
      if (k.size() > 64) return ApiFail(Bad("metadata", "key '" + k.substr(0, 64) + "...' is longer than 64 characters"));
      if (!v.is_string() || v.get<std::string>().size() > 512)
        return ApiFail(Bad("metadata." + k, "expected a string of at most 512 characters"));
    }
    r.metadata = m;
  }
  if (body.contains("user") && !body["user"].is_null()) {
    auto u = String(body["user"], "user");
    if (!u) return ApiFail(u.error());
    r.user = *u;
  }
  if (body.contains("seed")) r.seed = body["seed"];
  if (body.contains("thinking_budget")) r.thinking_budget = body["thinking_budget"];
  if (body.contains("speculative")) r.speculative = body["speculative"];
  return r;
}

}  // namespace

ApiResult<ResponsesRequest> ParseResponsesRequest(std::string_view body) {
  if (body.empty()) return ApiFail(ApiError::InvalidRequest("The request body is empty; expected a JSON object"));
  if (auto v = FindJsonLimitViolation(body, kRequestJsonLimits)) {
    const std::string param = JsonPathString("", v->path);
    return ApiFail(ApiError::InvalidRequest("The request body " + v->message, param));
  }
  ojson parsed;
  try {
    parsed = ojson::parse(body.begin(), body.end());
  } catch (const ojson::exception& e) {
    return ApiFail(ApiError::InvalidRequest(std::string("The request body is not valid JSON: ") + e.what()));
  }
  return Read(parsed);
}

ojson ChatBodyFor(const ResponsesRequest& req, const ojson& history) {
  ojson messages = ojson::array();
  if (req.instructions) messages.push_back({{"role", "system"}, {"content", *req.instructions}});
  for (const auto& m : history) messages.push_back(m);
  for (const auto& m : req.messages) messages.push_back(m);
  ojson body = {{"messages", std::move(messages)}};
  if (!req.model.empty()) body["model"] = req.model;
  if (!req.tools.empty()) {
    ojson tools = ojson::array();
    for (const auto& t : req.tools) {
      ojson fn = {{"name", t["name"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      fn["parameters"] = t["parameters"];
      fn["strict"] = t["strict"];
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    body["tools"] = std::move(tools);
    if (req.tool_choice.is_string()) body["tool_choice"] = req.tool_choice;
    else body["tool_choice"] = {{"type", "function"}, {"function", {{"name", req.tool_choice["name"]}}}};
    body["parallel_tool_calls"] = req.parallel_tool_calls;
  }
  if (req.effort) body["reasoning_effort"] = *req.effort;
  if (req.max_output_tokens) body["max_completion_tokens"] = *req.max_output_tokens;
  if (req.temperature) body["temperature"] = *req.temperature;
  if (req.top_p) body["top_p"] = *req.top_p;
  const std::string format = req.text_format["type"];
  if (format == "json_object") {
    body["response_format"] = {{"type", "json_object"}};
  } else if (format == "json_schema") {
    ojson schema = {{"name", req.text_format["name"]}, {"schema", req.text_format["schema"]},
                    {"strict", req.text_format["strict"]}};
    if (req.text_format.contains("description")) schema["description"] = req.text_format["description"];
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  }
  if (!req.user.empty()) body["user"] = req.user;
  if (!req.seed.is_null()) body["seed"] = req.seed;
  if (!req.thinking_budget.is_null()) body["thinking_budget"] = req.thinking_budget;
  if (!req.speculative.is_null()) body["speculative"] = req.speculative;
  if (req.stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

ApiError RenameChatError(ApiError error, const ResponsesRequest& req, size_t history_size) {
  std::string& p = error.param;
  auto replace_prefix = [&](std::string_view from, const std::string& to) {
    if (!p.starts_with(from)) return false;
    const std::string old = p.substr(0, from.size());
    p = to + p.substr(from.size());
    // The message quotes the field too.
    for (size_t at = error.message.find(old); at != std::string::npos; at = error.message.find(old, at + to.size()))
      error.message.replace(at, old.size(), to);
    return true;
  };
  if (p == "messages") {
    p = "input";
    return error;
  }
  if (p.starts_with("messages[")) {
    const size_t close = p.find(']');
    size_t k = 0;
    try {
      k = std::stoul(p.substr(9, close - 9));
    } catch (...) {
      return error;
    }
    const size_t first = req.instructions ? 1 : 0;
    std::string to;
    if (req.instructions && k == 0) to = "instructions";
    else if (k - first < history_size) to = "previous_response_id";
    else if (k - first - history_size < req.message_params.size()) to = req.message_params[k - first - history_size];
    else return error;
    const std::string from = p.substr(0, close + 1);
    replace_prefix(from, to);
    if (p.ends_with(".tool_call_id")) p.replace(p.size() - 13, 13, ".call_id");
    // An input_image part's URL is its image_url string; a tool message's
    // content came from a function_call_output's output.
    if (to.starts_with("input") && k - first - history_size < req.messages.size()) {
      std::string fixed = p;
      if (fixed.ends_with(".image_url.url")) fixed.resize(fixed.size() - 4);
      const size_t c = fixed.find(".content[", to.size());
      if (c == to.size() && req.messages[k - first - history_size].value("role", "") == "tool")
        fixed.replace(c, 9, ".output[");
      if (fixed != p) replace_prefix(p, fixed);
    }
    if (to == "previous_response_id" || to == "instructions") p = to;
    return error;
  }
  if (p.starts_with("tools[")) {
    const size_t close = p.find(']');
    if (close != std::string::npos && p.compare(close + 1, 10, ".function.") == 0)
      replace_prefix(p.substr(0, close + 10), p.substr(0, close + 1));
    return error;
  }
  if (replace_prefix("response_format.json_schema", "text.format")) return error;
  if (replace_prefix("response_format", "text.format")) return error;
  if (replace_prefix("max_completion_tokens", "max_output_tokens")) return error;
  if (replace_prefix("reasoning_effort", "reasoning.effort")) return error;
  if (replace_prefix("tool_choice.function", "tool_choice")) return error;
  return error;
}

}  // namespace moeserve::daemon

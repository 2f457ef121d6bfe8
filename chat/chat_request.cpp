#include "moeserve/chat/chat_request.hpp"

#include "moeserve/engine/json_grammar.hpp"

#include "moeserve/chat/tool_chain.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <span>

namespace moeserve::chat {
namespace {

using ojson = nlohmann::ordered_json;

std::string TypeName(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

ApiError WrongType(const std::string& param, const std::string& expected, const ojson& got) {
  return ApiError::InvalidRequest("'" + param + "' must be " + expected + ", got " + TypeName(got), param);
}

// OpenAI content: a string, null, or an array of parts. Text parts are
// joined; image_url parts (user and tool messages only) are recorded in
// `images` with the byte offset in the joined text where they sit. Audio,
// file and video parts are refused by name.
ApiResult<std::string> ReadContent(const ojson& v, const std::string& param, engine::ChatRole role,
                                   size_t message_index, std::vector<ImagePart>& images) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return ApiFail(WrongType(param, "a string or an array of content parts", v));
  const bool images_allowed = role == engine::ChatRole::kUser || role == engine::ChatRole::kTool;
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = param + "[" + std::to_string(i) + "]";
    const ojson& part = v[i];
    if (!part.is_object()) return ApiFail(WrongType(p, "an object", part));
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return ApiFail(ApiError::InvalidRequest("'" + p + ".type' must be \"text\" or \"image_url\"", p + ".type"));
    const std::string& kind = type->get_ref<const std::string&>();
    if (kind == "image_url") {
      if (!images_allowed)
        return ApiFail(ApiError::InvalidRequest(
            "'" + p + "' is an image part: images are accepted in user and tool messages only", p + ".type"));
      auto iu = part.find("image_url");
      if (iu == part.end() || !iu->is_object())
        return ApiFail(WrongType(p + ".image_url", "an object {\"url\": ...}", iu == part.end() ? ojson() : *iu));
      auto url = iu->find("url");
      if (url == iu->end() || !url->is_string() || url->get_ref<const std::string&>().empty())
        return ApiFail(ApiError::InvalidRequest("'" + p + ".image_url.url' must be a non-empty string (a data: URL)",
                                                p + ".image_url.url"));
      ImagePart image;
      image.message = message_index;
      image.text_offset = text.size();
      image.url = url->get<std::string>();
      image.param = p + ".image_url.url";
      auto detail = iu->find("detail");
      if (detail != iu->end() && !detail->is_null()) {
        if (!detail->is_string() || (*detail != "low" && *detail != "high" && *detail != "auto"))
          return ApiFail(ApiError::InvalidRequest("'" + p + ".image_url.detail' must be \"low\", \"high\" or \"auto\"",
                                                  p + ".image_url.detail"));
        image.detail = detail->get<std::string>();
      }
      images.push_back(std::move(image));
      continue;
    }
    if (kind == "input_audio" || kind == "audio" || kind == "file" || kind == "video" || kind == "video_url" ||
        kind == "input_video") {
      return ApiFail(ApiError::InvalidRequest("'" + p + ".type' is \"" + kind +
                                                  "\": audio, video and file parts are not supported; this server "
                                                  "reads text and images",
                                              p + ".type"));
    }
    if (kind != "text")
      return ApiFail(ApiError::InvalidRequest("'" + p + ".type' must be \"text\" or \"image_url\"", p + ".type"));
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return ApiFail(WrongType(p + ".text", "a string", t == part.end() ? ojson() : *t));
    text += t->get<std::string>();
  }
  return text;
}

ApiResult<std::optional<std::string>> OptionalString(const ojson& obj, const char* key, const std::string& param) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return ApiFail(WrongType(param, "a string", *it));
  return std::optional<std::string>(it->get<std::string>());
}

ApiResult<engine::ChatToolCall> ReadToolCall(const ojson& v, const std::string& param, const JsonLimits& limits) {
  if (!v.is_object()) return ApiFail(WrongType(param, "an object", v));
  engine::ChatToolCall call;
  auto id = v.find("id");
  if (id == v.end() || !id->is_string() || id->get<std::string>().empty()) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".id' must be a non-empty string", param + ".id"));
  }
  call.id = id->get<std::string>();
  auto type = v.find("type");
  if (type != v.end() && !(type->is_string() && *type == "function")) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".type' must be \"function\"", param + ".type"));
  }
  auto fn = v.find("function");
  if (fn == v.end() || !fn->is_object()) {
    return ApiFail(WrongType(param + ".function", "an object", fn == v.end() ? ojson() : *fn));
  }
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".function.name' must be a non-empty string", param + ".function.name"));
  }
  call.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end() || args->is_null()) {
    call.arguments = ojson::object();
  } else if (args->is_string()) {
    // Parsed here, once, within the limits; the renderer writes this value
    // and never parses the text again.
    std::string p = param + ".function.arguments";
    auto value = engine::ToolCallArgumentsFromText(args->get_ref<const std::string&>(), limits, "'" + p + "'");
    if (!value) return ApiFail(ApiError::InvalidRequest(value.error().message(), p));
    call.arguments = std::move(*value);
  } else if (args->is_object()) {
    // Some clients send the object itself; render it as the JSON it is (the
    // body's limits bound it).
    call.arguments = *args;
  } else {
    return ApiFail(WrongType(param + ".function.arguments", "a string", *args));
  }
  return call;
}

ApiResult<engine::ChatMessage> ReadMessage(const ojson& v, const std::string& param, const JsonLimits& limits,
                                           size_t index, std::vector<ImagePart>& images) {
  if (!v.is_object()) return ApiFail(WrongType(param, "an object", v));
  auto role_it = v.find("role");
  if (role_it == v.end() || !role_it->is_string()) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".role' must be one of system, developer, user, assistant, tool",
                                            param + ".role"));
  }
  auto role = engine::ParseChatRole(role_it->get<std::string>());
  if (!role) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".role' is '" + role_it->get<std::string>() +
                                                "'; expected system, developer, user, assistant or tool",
                                            param + ".role"));
  }
  engine::ChatMessage m;
  m.role = *role;
  auto content = v.find("content");
  if (content != v.end()) {
    auto text = ReadContent(*content, param + ".content", m.role, index, images);
    if (!text) return ApiFail(text.error());
    m.content = std::move(*text);
  } else if (m.role != engine::ChatRole::kAssistant) {
    return ApiFail(ApiError::InvalidRequest("'" + param + ".content' is required for a " +
                                                role_it->get<std::string>() + " message",
                                            param + ".content"));
  }
  if (m.role == engine::ChatRole::kAssistant) {
    // Both names are read (api.md): dropping earlier reasoning would change
    // what the model sees from one turn to the next.
    auto rc = OptionalString(v, "reasoning_content", param + ".reasoning_content");
    if (!rc) return ApiFail(rc.error());
    auto r = OptionalString(v, "reasoning", param + ".reasoning");
    if (!r) return ApiFail(r.error());
    if (*rc) m.reasoning = **rc;
    else if (*r) m.reasoning = **r;
    auto calls = v.find("tool_calls");
    if (calls != v.end() && !calls->is_null()) {
      if (!calls->is_array()) return ApiFail(WrongType(param + ".tool_calls", "an array", *calls));
      for (size_t i = 0; i < calls->size(); ++i) {
        auto call = ReadToolCall((*calls)[i], param + ".tool_calls[" + std::to_string(i) + "]", limits);
        if (!call) return ApiFail(call.error());
        m.tool_calls.push_back(std::move(*call));
      }
    }
  }
  if (m.role == engine::ChatRole::kTool) {
    auto id = v.find("tool_call_id");
    if (id == v.end() || !id->is_string() || id->get<std::string>().empty()) {
      return ApiFail(ApiError::InvalidRequest("'" + param + ".tool_call_id' must be the id of the tool call it answers",
                                              param + ".tool_call_id"));
    }
    m.tool_call_id = id->get<std::string>();
  }
  return m;
}

ApiResult<void> ReadTools(const ojson& body, ChatRequest& req) {
  auto tools = body.find("tools");
  if (tools == body.end() || tools->is_null()) return {};
  if (!tools->is_array()) return ApiFail(WrongType("tools", "an array", *tools));
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    std::string p = "tools[" + std::to_string(i) + "]";
    const ojson& t = (*tools)[i];
    if (!t.is_object()) return ApiFail(WrongType(p, "an object", t));
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      return ApiFail(ApiError::InvalidRequest("'" + p + ".type' must be \"function\"", p + ".type"));
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return ApiFail(WrongType(p + ".function", "an object", fn == t.end() ? ojson() : *fn));
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
      return ApiFail(ApiError::InvalidRequest("'" + p + ".function.name' must be a non-empty string", p + ".function.name"));
    }
    ToolSpec spec;
    spec.name = name->get<std::string>();
    if (!names.insert(spec.name).second) {
      return ApiFail(ApiError::InvalidRequest("'" + p + ".function.name': the tool name '" + spec.name + "' appears twice",
                                              p + ".function.name"));
    }
    auto params = fn->find("parameters");
    if (params == fn->end() || params->is_null()) {
      spec.parameters = ojson::object();
    } else if (!params->is_object()) {
      return ApiFail(WrongType(p + ".function.parameters", "a JSON schema object", *params));
    } else {
      spec.parameters = *params;
    }
    spec.index = static_cast<int>(i);
    auto strict = fn->find("strict");
    if (strict != fn->end() && !strict->is_null()) {
      if (!strict->is_boolean()) return ApiFail(WrongType(p + ".function.strict", "a boolean", *strict));
      spec.strict = strict->get<bool>();
    }
    // Strict: a keyword the grammar does not enforce is refused, never passed over.
    if (spec.strict) {
      if (auto ok = engine::CheckSchemaSupported(spec.parameters); !ok) {
        return ApiFail(ApiError::InvalidRequest("'" + p + ".function.parameters': " + ok.error().message(),
                                                p + ".function.parameters"));
      }
    }
    req.tool_specs.push_back(std::move(spec));
  }
  if (!tools->empty()) req.tools = *tools;
  return {};
}

ApiResult<void> ReadToolChoice(const ojson& body, ChatRequest& req) {
  auto tc = body.find("tool_choice");
  if (tc == body.end() || tc->is_null()) {
    req.tool_choice = req.tool_specs.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
    return {};
  }
  if (tc->is_string()) {
    std::string s = tc->get<std::string>();
    if (s == "auto") req.tool_choice = ToolChoice::kAuto;
    else if (s == "none") req.tool_choice = ToolChoice::kNone;
    else if (s == "required") req.tool_choice = ToolChoice::kRequired;
    else return ApiFail(ApiError::InvalidRequest("'tool_choice' is '" + s + "'; expected auto, none, required or {\"type\":\"function\",\"function\":{\"name\":...}}", "tool_choice"));
  } else if (tc->is_object()) {
    auto fn = tc->find("function");
    auto name = (fn != tc->end() && fn->is_object()) ? fn->find("name") : tc->end();
    if (fn == tc->end() || !fn->is_object() || name == fn->end() || !name->is_string()) {
      return ApiFail(ApiError::InvalidRequest("'tool_choice.function.name' must name one of the request's tools",
                                              "tool_choice.function.name"));
    }
    req.tool_choice = ToolChoice::kNamed;
    req.tool_choice_name = name->get<std::string>();
    bool found = false;
    for (const auto& t : req.tool_specs) found |= t.name == req.tool_choice_name;
    if (!found) {
      return ApiFail(ApiError::InvalidRequest("'tool_choice.function.name' is '" + req.tool_choice_name +
                                                  "', which is not among the request's tools",
                                              "tool_choice.function.name"));
    }
  } else {
    return ApiFail(WrongType("tool_choice", "a string or an object", *tc));
  }
  if ((req.tool_choice == ToolChoice::kRequired) && req.tool_specs.empty()) {
    return ApiFail(ApiError::InvalidRequest("'tool_choice' is required but the request has no tools", "tool_choice"));
  }
  return {};
}

ApiResult<std::optional<int>> OptionalCount(const ojson& body, const char* key, int min_value) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<int>();
  if (!it->is_number_integer() && !(it->is_number_float() && std::floor(it->get<double>()) == it->get<double>())) {
    return ApiFail(WrongType(key, "an integer", *it));
  }
  double v = it->get<double>();
  if (v < min_value || v > std::numeric_limits<int>::max()) {
    return ApiFail(ApiError::InvalidRequest("'" + std::string(key) + "' must be at least " + std::to_string(min_value) +
                                                " (got " + it->dump() + ")",
                                            key));
  }
  return std::optional<int>(static_cast<int>(v));
}

ApiResult<void> ReadSampling(const ojson& body, ChatRequest& req) {
  auto number = [&](const char* key, float lo, float hi, float& out) -> ApiResult<void> {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return {};
    if (!it->is_number()) return ApiFail(WrongType(key, "a number", *it));
    double v = it->get<double>();
    if (!(v >= lo && v <= hi)) {
      return ApiFail(ApiError::InvalidRequest("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " +
                                                  std::to_string(hi) + " (got " + it->dump() + ")",
                                              key));
    }
    out = static_cast<float>(v);
    return {};
  };
  auto t = number("temperature", 0.0f, 2.0f, req.temperature);
  if (!t) return t;
  auto p = number("top_p", 0.0f, 1.0f, req.top_p);
  if (!p) return p;
  if (req.top_p <= 0.0f) return ApiFail(ApiError::InvalidRequest("'top_p' must be greater than 0", "top_p"));
  auto seed = body.find("seed");
  if (seed != body.end() && !seed->is_null()) {
    if (seed->is_number_unsigned()) req.seed = seed->get<uint64_t>();
    else if (seed->is_number_integer()) req.seed = static_cast<uint64_t>(seed->get<int64_t>());
    else return ApiFail(WrongType("seed", "an integer", *seed));
  }
  auto mt = OptionalCount(body, "max_tokens", 1);
  if (!mt) return ApiFail(mt.error());
  auto mct = OptionalCount(body, "max_completion_tokens", 1);
  if (!mct) return ApiFail(mct.error());
  req.max_tokens = *mct ? *mct : *mt;
  auto stop = body.find("stop");
  if (stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      req.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) return ApiFail(ApiError::InvalidRequest("'stop' may hold at most 4 sequences", "stop"));
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return ApiFail(WrongType("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]));
        req.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return ApiFail(WrongType("stop", "a string or an array of strings", *stop));
    }
    for (size_t i = 0; i < req.stop.size(); ++i) {
      if (req.stop[i].empty()) return ApiFail(ApiError::InvalidRequest("'stop' sequences must not be empty", "stop"));
    }
  }
  return {};
}

// response_format {"type":"json_schema","json_schema":{"name","schema","strict","description"}}.
ApiResult<void> ReadJsonSchemaFormat(const ojson& rf, ChatRequest& req) {
  auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object()) {
    return ApiFail(WrongType("response_format.json_schema", "an object", js == rf.end() ? ojson() : *js));
  }
  auto name = js->find("name");
  if (name == js->end() || !name->is_string() || name->get<std::string>().empty() ||
      name->get<std::string>().size() > 64 ||
      !std::all_of(name->get_ref<const std::string&>().begin(), name->get_ref<const std::string&>().end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; })) {
    return ApiFail(ApiError::InvalidRequest(
        "'response_format.json_schema.name' must be 1 to 64 letters, digits, underscores or dashes",
        "response_format.json_schema.name"));
  }
  req.response_schema_name = name->get<std::string>();
  auto description = js->find("description");
  if (description != js->end() && !description->is_null()) {
    if (!description->is_string()) {
      return ApiFail(WrongType("response_format.json_schema.description", "a string", *description));
    }
    req.response_schema_description = description->get<std::string>();
  }
  auto strict = js->find("strict");
  if (strict != js->end() && !strict->is_null()) {
    if (!strict->is_boolean()) return ApiFail(WrongType("response_format.json_schema.strict", "a boolean", *strict));
    req.response_schema_strict = strict->get<bool>();
  }
  auto schema = js->find("schema");
  if (schema != js->end() && !schema->is_null()) {
    if (!schema->is_object()) return ApiFail(WrongType("response_format.json_schema.schema", "a JSON schema object", *schema));
    req.response_schema = *schema;
  }
  if (req.response_schema_strict) {
    if (auto ok = engine::CheckSchemaSupported(req.response_schema.is_null() ? ojson::object() : req.response_schema); !ok) {
      return ApiFail(ApiError::InvalidRequest("'response_format.json_schema.schema': " + ok.error().message(),
                                              "response_format.json_schema.schema"));
    }
  }
  req.json_object = true;
  return {};
}

// OpenAI's logprobs (boolean) and top_logprobs (0..20, only with logprobs).
ApiResult<void> ReadLogprobs(const ojson& body, ChatRequest& req) {
  auto lp = body.find("logprobs");
  if (lp != body.end() && !lp->is_null()) {
    if (!lp->is_boolean()) return ApiFail(WrongType("logprobs", "a boolean", *lp));
    req.logprobs = lp->get<bool>();
  }
  auto top = body.find("top_logprobs");
  if (top == body.end() || top->is_null()) return {};
  if (!top->is_number_integer() || top->get<int64_t>() < 0 || top->get<int64_t>() > 20) {
    return ApiFail(ApiError::InvalidRequest("'top_logprobs' must be an integer between 0 and 20 (got " + top->dump() + ")",
                                            "top_logprobs"));
  }
  if (!req.logprobs) {
    return ApiFail(ApiError::InvalidRequest("'top_logprobs' requires 'logprobs' to be true", "top_logprobs"));
  }
  req.top_logprobs = static_cast<int>(top->get<int64_t>());
  return {};
}

ApiResult<void> ReadFlags(const ojson& body, ChatRequest& req) {
  auto boolean = [&](const char* key, bool& out) -> ApiResult<void> {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return {};
    if (!it->is_boolean()) return ApiFail(WrongType(key, "a boolean", *it));
    out = it->get<bool>();
    return {};
  };
  if (auto r = boolean("stream", req.stream); !r) return r;
  if (auto r = boolean("parallel_tool_calls", req.parallel_tool_calls); !r) return r;
  auto so = body.find("stream_options");
  if (so != body.end() && !so->is_null()) {
    if (!so->is_object()) return ApiFail(WrongType("stream_options", "an object", *so));
    auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return ApiFail(WrongType("stream_options.include_usage", "a boolean", *iu));
      req.include_usage = iu->get<bool>();
    }
  }
  auto user = OptionalString(body, "user", "user");
  if (!user) return ApiFail(user.error());
  if (*user) req.user = **user;
  auto rf = body.find("response_format");
  if (rf != body.end() && !rf->is_null()) {
    if (!rf->is_object()) return ApiFail(WrongType("response_format", "an object", *rf));
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string()) {
      return ApiFail(ApiError::InvalidRequest("'response_format.type' must be \"text\" or \"json_object\"", "response_format.type"));
    }
    std::string t = type->get<std::string>();
    if (t == "json_object" || t == "json_schema") req.response_format = *rf;
    if (t == "json_object") req.json_object = true;
    else if (t == "json_schema") {
      if (auto r = ReadJsonSchemaFormat(*rf, req); !r) return r;
    } else if (t != "text") {
      return ApiFail(ApiError::InvalidRequest("'response_format.type' is '" + t +
                                                  "'; this server supports \"text\", \"json_object\" and \"json_schema\"",
                                              "response_format.type"));
    }
  }
  auto effort = OptionalString(body, "reasoning_effort", "reasoning_effort");
  if (!effort) return ApiFail(effort.error());
  if (*effort) {
    req.reasoning_effort = ParseReasoningEffort(**effort);
    if (!req.reasoning_effort) {
      return ApiFail(ApiError::InvalidRequest("'reasoning_effort' is '" + **effort + "'; expected low, medium or high",
                                              "reasoning_effort"));
    }
  }
  auto tb = OptionalCount(body, "thinking_budget", 0);
  if (!tb) return ApiFail(tb.error());
  req.thinking_budget = *tb;
  auto speculative = OptionalString(body, "speculative", "speculative");
  if (!speculative) return ApiFail(speculative.error());
  if (*speculative) {
    req.speculative = engine::ParseSpeculativeMode(**speculative);
    if (!req.speculative)
      return ApiFail(ApiError::InvalidRequest(
          "'speculative' is '" + **speculative + "'; expected off, mtp, lookup or auto", "speculative"));
  }
  return ReadLogprobs(body, req);
}

}  // namespace

std::string_view ReasoningEffortName(ReasoningEffort e) {
  switch (e) {
    case ReasoningEffort::kLow: return "low";
    case ReasoningEffort::kMedium: return "medium";
    case ReasoningEffort::kHigh: return "high";
  }
  return "medium";
}

std::optional<ReasoningEffort> ParseReasoningEffort(std::string_view s) {
  if (s == "low") return ReasoningEffort::kLow;
  if (s == "medium") return ReasoningEffort::kMedium;
  if (s == "high") return ReasoningEffort::kHigh;
  return std::nullopt;
}

ApiResult<void> ValidateToolHistory(const std::vector<engine::ChatMessage>& messages) {
  // The rules live in tool_chain.hpp, shared with the session history's
  // compression; here they become api.md's errors.
  auto v = FindToolChainViolation(messages);
  if (!v) return {};
  using Kind = ToolChainViolation::Kind;
  const std::string p = "messages[" + std::to_string(v->message) + "]";
  const std::string call = p + ".tool_calls[" + std::to_string(v->call) + "]";
  switch (v->kind) {
    case Kind::kDuplicateCallId:
      return ApiFail(ApiError::InvalidToolHistory("tool call id '" + v->id + "' is used by more than one assistant tool call",
                                                  call + ".id"));
    case Kind::kUnknownResult:
    case Kind::kAnsweredTwice: {
      std::string why = v->kind == Kind::kAnsweredTwice ? "was already answered by an earlier tool message"
                                                        : "matches no earlier assistant tool call";
      return ApiFail(ApiError::InvalidToolHistory(p + ".tool_call_id '" + v->id + "' " + why, p + ".tool_call_id"));
    }
    case Kind::kUnanswered:
      return ApiFail(ApiError::InvalidToolHistory(call + " (id '" + v->id +
                                                      "') has no tool message with its result before the user message "
                                                      "messages[" + std::to_string(v->before) + "]",
                                                  call));
  }
  return {};
}

namespace {

// The field a depth violation belongs to, in api.md's `param` terms: the path
// is followed while it runs through the request's own structure (messages,
// their tool calls, tools) and cut at the first step into a field's value (a
// content, a schema, arguments, response_format, an unknown field).
std::string ParamOfDeepPath(const std::vector<JsonPathStep>& path) {
  static const std::set<std::string> kStructure = {"messages",
                                                   "messages[]",
                                                   "messages[].tool_calls",
                                                   "messages[].tool_calls[]",
                                                   "messages[].tool_calls[].function",
                                                   "tools",
                                                   "tools[]",
                                                   "tools[].function"};
  if (path.empty() || path[0].is_index) return "";  // the body itself is not an object
  std::string shape;
  size_t keep = 0;
  while (keep < path.size()) {
    const JsonPathStep& step = path[keep];
    shape += step.is_index ? "[]" : (shape.empty() ? "" : ".") + step.key;
    ++keep;
    if (!kStructure.contains(shape)) break;
  }
  return JsonPathString("", std::span(path).first(keep));
}

ApiResult<ChatRequest> ReadChatRequest(const ojson& body, const JsonLimits& limits) {
  if (!body.is_object()) return ApiFail(ApiError::InvalidRequest("The request body must be a JSON object, got " + TypeName(body)));
  ChatRequest req;
  auto model = body.find("model");
  if (model != body.end() && !model->is_null()) {
    if (!model->is_string()) return ApiFail(WrongType("model", "a string", *model));
    req.model = model->get<std::string>();
  }
  auto messages = body.find("messages");
  if (messages == body.end() || messages->is_null()) {
    return ApiFail(ApiError::InvalidRequest("'messages' is required: the conversation to continue", "messages"));
  }
  if (!messages->is_array()) return ApiFail(WrongType("messages", "an array", *messages));
  if (messages->empty()) return ApiFail(ApiError::InvalidRequest("'messages' must hold at least one message", "messages"));
  for (size_t i = 0; i < messages->size(); ++i) {
    auto m = ReadMessage((*messages)[i], "messages[" + std::to_string(i) + "]", limits, i, req.images);
    if (!m) return ApiFail(m.error());
    req.messages.push_back(std::move(*m));
  }
  if (auto r = ReadTools(body, req); !r) return ApiFail(r.error());
  if (auto r = ReadToolChoice(body, req); !r) return ApiFail(r.error());
  if (auto r = ReadSampling(body, req); !r) return ApiFail(r.error());
  if (auto r = ReadFlags(body, req); !r) return ApiFail(r.error());
  if (auto r = ValidateToolHistory(req.messages); !r) return ApiFail(r.error());
  return req;
}

}  // namespace

ApiResult<ChatRequest> ParseChatRequestJson(const ojson& body, const JsonLimits& limits) {
  if (auto depth = CheckJsonDepth(body, limits.max_depth, "The request body"); !depth) {
    return ApiFail(ApiError::InvalidRequest(depth.error().message()));
  }
  return ReadChatRequest(body, limits);
}

ApiResult<ChatRequest> ParseChatRequest(std::string_view body, const JsonLimits& limits) {
  if (body.empty()) return ApiFail(ApiError::InvalidRequest("The request body is empty; expected a JSON object"));
  // Schemas, contents and arguments are walked and re-serialised recursively
  // later (grammar compiler, renderer); the scan refuses absurd nesting before
  // anything is built, and names the field it is in.
  if (auto v = FindJsonLimitViolation(body, limits)) {
    if (v->kind == JsonLimitViolation::Kind::kTooLarge) {
      return ApiFail(ApiError::InvalidRequest("The request body " + v->message));
    }
    std::string param = ParamOfDeepPath(v->path);
    std::string where = param.empty() ? "The request body " : "'" + param + "': the request body ";
    return ApiFail(ApiError::InvalidRequest(where + v->message, param));
  }
  ojson parsed;
  try {
    parsed = ojson::parse(body.begin(), body.end());
  } catch (const ojson::parse_error& e) {
    // nlohmann rejects invalid UTF-8 inside strings too; its message names the
    // byte offset ("parse error at line 1, column 17: ..."), which is what a
    // person needs to find the mistake. (ReplyError re-encodes any stray bytes.)
    return ApiFail(ApiError::InvalidRequest(std::string("The request body is not valid JSON: ") + e.what()));
  } catch (const ojson::exception& e) {
    // Valid syntax nlohmann cannot hold, such as a number past double's range
    // (out_of_range.406): the client's input, so a 400, never an escape.
    return ApiFail(ApiError::InvalidRequest(std::string("The request body cannot be read: ") + e.what()));
  }
  return ReadChatRequest(parsed, limits);
}

}  // namespace moeserve::chat

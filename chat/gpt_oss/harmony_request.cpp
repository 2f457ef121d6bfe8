#include "moeserve/chat/gpt_oss/harmony_request.hpp"

namespace moeserve::chat {

namespace {

engine::HarmonyEffort ToHarmony(ReasoningEffort e) {
  switch (e) {
    case ReasoningEffort::kLow:
      return engine::HarmonyEffort::kLow;
    case ReasoningEffort::kMedium:
      return engine::HarmonyEffort::kMedium;
    case ReasoningEffort::kHigh:
      break;
  }
  return engine::HarmonyEffort::kHigh;
}

}  // namespace

ApiResult<HarmonyPrompt> RenderHarmonyRequest(const ChatRequest& req, ReasoningEffort effort,
                                              const HarmonyServing& serving, const engine::GrammarLimits& limits) {
  // The same schema checks as moe-dsa-v1's, so a tool set is refused alike by every family.
  for (const auto& t : req.tool_specs) {
    auto grammar = engine::JsonGrammar::ForObjectSchema(t.parameters, limits, t.strict);
    if (!grammar) {
      return ApiFail(ApiError::InvalidRequest(grammar.error().message(),
                                              "tools[" + std::to_string(t.index) + "].function.parameters"));
    }
  }

  HarmonyPrompt out;
  const bool offer_tools = req.tool_choice != ToolChoice::kNone && !req.tool_specs.empty();
  const nlohmann::ordered_json* tools = offer_tools && req.tools.is_array() ? &req.tools : nullptr;
  if (offer_tools) {
    for (const auto& t : req.tool_specs) {
      if (req.tool_choice != ToolChoice::kNamed || t.name == req.tool_choice_name) out.tool_names.push_back(t.name);
    }
  }
  engine::HarmonySystemOptions system;
  system.effort = ToHarmony(effort);
  system.current_date = serving.current_date;
  if (req.json_object) {
    // harmony's structured output: the schema in the developer message; the
    // final answer is constrained to it (harmony_structure.hpp).
    engine::HarmonyResponseFormat format;
    format.name = req.response_schema_name.empty() ? "json_object" : req.response_schema_name;
    format.description = req.response_schema_name.empty() ? "Answer with one JSON object." : req.response_schema_description;
    format.schema = req.response_schema.is_object() ? req.response_schema : nlohmann::ordered_json{{"type", "object"}};
    system.response_format = std::move(format);
  }
  auto prompt = engine::RenderHarmonyChat(*serving.tokenizer, req.messages, tools, system, /*add_generation_prompt=*/true);
  if (!prompt) {
    const std::string& field = prompt.error().field();
    return ApiFail(ApiError::InvalidRequest(prompt.error().message(), field.empty() ? "messages" : field));
  }
  out.prompt = std::move(*prompt);

  // A call the request demands: the server writes its header, as the
  // renderer writes a call in the history.
  const bool must_call = req.tool_choice == ToolChoice::kNamed || req.tool_choice == ToolChoice::kRequired;
  if (must_call && !out.tool_names.empty()) {
    const bool one = out.tool_names.size() == 1;
    auto head = serving.tokenizer->Encode(one ? "commentary to=functions." + out.tool_names[0] + " " : "commentary to=functions.");
    auto json_word = serving.tokenizer->Encode("json");
    if (!head || !json_word) return ApiFail(ApiError::Internal("encoding the call header failed"));
    out.header_tail.push_back(serving.tokens.constrain);
    out.header_tail.insert(out.header_tail.end(), json_word->begin(), json_word->end());
    out.header_tail.push_back(serving.tokens.message);
    out.prefill.push_back(serving.tokens.channel);
    out.prefill.insert(out.prefill.end(), head->begin(), head->end());
    if (one) {
      out.prefill.insert(out.prefill.end(), out.header_tail.begin(), out.header_tail.end());
      for (const auto& t : req.tool_specs)
        if (t.name == out.tool_names[0]) out.opened_call = t;
    } else {
      for (const auto& t : req.tool_specs) out.call_choices.push_back(t);
    }
    out.prompt.insert(out.prompt.end(), out.prefill.begin(), out.prefill.end());
  }
  return out;
}

}  // namespace moeserve::chat

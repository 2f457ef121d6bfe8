#include "moeserve/daemon/responses/response_output.hpp"

#include <openssl/rand.h>

#include <random>

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

namespace {
std::string Str(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
}
int64_t Int(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_number_integer() ? o[key].get<int64_t>() : 0;
}
}  // namespace

ChatAnswer ChatAnswerFrom(const ojson& completion) {
  ChatAnswer a;
  if (!completion.contains("choices") || !completion["choices"].is_array() || completion["choices"].empty()) return a;
  const ojson& choice = completion["choices"][0];
  a.finish_reason = Str(choice, "finish_reason");
  const ojson message = choice.value("message", ojson::object());
  a.content = Str(message, "content");
  a.reasoning = Str(message, "reasoning_content");
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    for (const auto& c : message["tool_calls"]) {
      const ojson fn = c.value("function", ojson::object());
      a.calls.push_back({Str(c, "id"), Str(fn, "name"), Str(fn, "arguments")});
    }
  }
  a.usage = completion.value("usage", ojson());
  a.tier = Str(completion, "tier");
  return a;
}

std::string NewItemId(const std::string& prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char raw[24];
  if (RAND_bytes(raw, sizeof raw) != 1) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    for (auto& b : raw) b = static_cast<unsigned char>(rng());
  }
  std::string id = prefix;
  for (unsigned char b : raw) id += kAlphabet[b % 62];
  return id;
}

ojson ReasoningItem(const std::string& id, const std::string& text) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", ojson::array({{{"type", "summary_text"}, {"text", text}}})}};
}

ojson MessageItem(const std::string& id, const std::string& text, const std::string& status) {
  ojson content = ojson::array();
  if (status == "completed" || !text.empty())
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}});
  return {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"status", status}, {"content", std::move(content)}};
}

ojson FunctionCallItem(const std::string& id, const ChatAnswer::Call& call, const std::string& status) {
  return {{"id", id},          {"type", "function_call"},      {"call_id", call.call_id},
          {"name", call.name}, {"arguments", call.arguments}, {"status", status}};
}

ojson OutputItems(const ChatAnswer& answer) {
  ojson out = ojson::array();
  if (!answer.reasoning.empty()) out.push_back(ReasoningItem(NewItemId("rs_"), answer.reasoning));
  if (!answer.content.empty() || answer.calls.empty())
    out.push_back(MessageItem(NewItemId("msg_"), answer.content, "completed"));
  for (const auto& c : answer.calls) out.push_back(FunctionCallItem(NewItemId("fc_"), c, "completed"));
  return out;
}

ojson ResponseUsage(const ojson& u) {
  const int64_t input = Int(u, "prompt_tokens"), output = Int(u, "completion_tokens");
  const ojson prompt_details = u.value("prompt_tokens_details", ojson());
  ojson input_details = {{"cached_tokens", Int(prompt_details, "cached_tokens")}};
  // Images' spans, within input_tokens, as chat's prompt_tokens_details has them.
  if (prompt_details.is_object() && prompt_details.contains("image_tokens"))
    input_details["image_tokens"] = Int(prompt_details, "image_tokens");
  return {{"input_tokens", input},
          {"input_tokens_details", std::move(input_details)},
          {"output_tokens", output},
          {"output_tokens_details",
           {{"reasoning_tokens", Int(u.value("completion_tokens_details", ojson()), "reasoning_tokens")}}},
          {"total_tokens", input + output}};
}

ojson ResponseShell(const std::string& id, int64_t created_at, const std::string& model, const ResponsesRequest& req,
                    const std::string& status) {
  return {{"id", id},
          {"object", "response"},
          {"created_at", created_at},
          {"status", status},
          {"background", req.background},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"instructions", req.instructions ? ojson(*req.instructions) : ojson(nullptr)},
          {"max_output_tokens", req.max_output_tokens ? ojson(*req.max_output_tokens) : ojson(nullptr)},
          {"model", model},
          {"output", ojson::array()},
          {"parallel_tool_calls", req.parallel_tool_calls},
          {"previous_response_id", req.previous_response_id ? ojson(*req.previous_response_id) : ojson(nullptr)},
          {"reasoning", {{"effort", req.effort ? ojson(*req.effort) : ojson(nullptr)}, {"summary", nullptr}}},
          {"store", req.store},
          {"temperature", req.temperature ? ojson(*req.temperature) : ojson(1.0)},
          {"text", {{"format", req.text_format}}},
          {"tool_choice", req.tool_choice},
          {"tools", req.tools},
          {"top_p", req.top_p ? ojson(*req.top_p) : ojson(1.0)},
          {"truncation", "disabled"},
          {"usage", nullptr},
          {"user", req.user.empty() ? ojson(nullptr) : ojson(req.user)},
          {"metadata", req.metadata}};
}

void FinishResponse(ojson& response, ojson output, const ChatAnswer& answer) {
  response["output"] = std::move(output);
  response["usage"] = ResponseUsage(answer.usage);
  if (answer.finish_reason == "length") {
    response["status"] = "incomplete";
    response["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else {
    response["status"] = "completed";
  }
  // The tier the request ran at (after any budget downgrade), as chat completions report it.
  if (!answer.tier.empty()) response["tier"] = answer.tier;
}

ojson ConversationAfter(const ojson& history, const ResponsesRequest& req, const ChatAnswer& answer) {
  ojson out = history.is_array() ? history : ojson::array();
  for (const auto& m : req.messages) out.push_back(m);
  ojson assistant = {{"role", "assistant"}, {"content", answer.content}};
  if (!answer.reasoning.empty()) assistant["reasoning_content"] = answer.reasoning;
  if (!answer.calls.empty()) {
    ojson calls = ojson::array();
    for (const auto& c : answer.calls)
      calls.push_back({{"id", c.call_id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    assistant["tool_calls"] = std::move(calls);
  }
  out.push_back(std::move(assistant));
  return out;
}

}  // namespace moeserve::daemon

#include "moeserve/daemon/responses/response_events.hpp"

namespace moeserve::daemon {

using ojson = nlohmann::ordered_json;

std::string ResponseEventWriter::Event(const std::string& type, ojson fields) {
  ojson e = {{"type", type}};
  for (auto& [k, v] : fields.items()) e[k] = std::move(v);
  e["sequence_number"] = sequence_++;
  return "event: " + type + "\ndata: " + e.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string ResponseEventWriter::Start(const ojson& shell) {
  std::string out = Event("response.created", {{"response", shell}});
  return out + Event("response.in_progress", {{"response", shell}});
}

std::string ResponseEventWriter::OpenItem(Open kind, ojson item) {
  std::string out = CloseOpenItem();
  open_ = kind;
  item_id_ = item["id"];
  output_.push_back(item);
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  // The item as added has no parts yet; the part events add them.
  if (kind == Open::kReasoning) item["summary"] = ojson::array();
  out += Event("response.output_item.added", {{"output_index", index}, {"item", std::move(item)}});
  if (kind == Open::kReasoning) {
    out += Event("response.reasoning_summary_part.added",
                 {{"item_id", item_id_}, {"output_index", index}, {"summary_index", 0},
                  {"part", {{"type", "summary_text"}, {"text", ""}}}});
  } else if (kind == Open::kMessage) {
    const ojson part = {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}};
    output_.back()["content"].push_back(part);
    out += Event("response.content_part.added",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  }
  return out;
}

std::string ResponseEventWriter::CloseOpenItem() {
  if (open_ == Open::kNone) return "";
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  ojson& item = output_.back();
  std::string out;
  if (open_ == Open::kReasoning) {
    const std::string text = item["summary"][0]["text"];
    out += Event("response.reasoning_summary_text.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"summary_index", 0}, {"text", text}});
    out += Event("response.reasoning_summary_part.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"summary_index", 0},
                  {"part", {{"type", "summary_text"}, {"text", text}}}});
  } else if (open_ == Open::kMessage) {
    const std::string text = item["content"][0]["text"];
    out += Event("response.output_text.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text}});
    out += Event("response.content_part.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", item["content"][0]}});
    item["status"] = "completed";
  } else {
    out += Event("response.function_call_arguments.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"arguments", item["arguments"]}});
    item["status"] = "completed";
  }
  out += Event("response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Open::kNone;
  call_index_ = -1;
  return out;
}

std::string ResponseEventWriter::Reasoning(const std::string& delta) {
  answer_.reasoning += delta;
  std::string out;
  if (open_ != Open::kReasoning) {
    ojson item = ReasoningItem(NewItemId("rs_"), "");
    out += OpenItem(Open::kReasoning, std::move(item));
  }
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  output_.back()["summary"][0]["text"] = output_.back()["summary"][0]["text"].get<std::string>() + delta;
  return out + Event("response.reasoning_summary_text.delta",
                     {{"item_id", item_id_}, {"output_index", index}, {"summary_index", 0}, {"delta", delta}});
}

std::string ResponseEventWriter::Content(const std::string& delta) {
  answer_.content += delta;
  std::string out;
  if (open_ != Open::kMessage) {
    ojson item = MessageItem(NewItemId("msg_"), "", "in_progress");
    out += OpenItem(Open::kMessage, std::move(item));
  }
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  ojson& part = output_.back()["content"][0];
  part["text"] = part["text"].get<std::string>() + delta;
  return out + Event("response.output_text.delta",
                     {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"delta", delta}});
}

std::string ResponseEventWriter::ToolCall(const ojson& t) {
  const int64_t call = t.value("index", int64_t{0});
  const ojson fn = t.value("function", ojson::object());
  std::string out;
  if (open_ != Open::kCall || call != call_index_) {
    ChatAnswer::Call c;
    c.call_id = t.value("id", std::string());
    c.name = fn.value("name", std::string());
    answer_.calls.push_back(c);
    out += OpenItem(Open::kCall, FunctionCallItem(NewItemId("fc_"), c, "in_progress"));
    call_index_ = call;
  }
  const std::string delta = fn.contains("arguments") && fn["arguments"].is_string() ? fn["arguments"].get<std::string>() : "";
  if (delta.empty()) return out;
  answer_.calls.back().arguments += delta;
  const int64_t index = static_cast<int64_t>(output_.size()) - 1;
  output_.back()["arguments"] = answer_.calls.back().arguments;
  return out + Event("response.function_call_arguments.delta",
                     {{"item_id", item_id_}, {"output_index", index}, {"delta", delta}});
}

std::string ResponseEventWriter::Chunk(const ojson& chunk) {
  if (chunk.contains("usage") && chunk["usage"].is_object()) answer_.usage = chunk["usage"];
  if (chunk.contains("tier") && chunk["tier"].is_string()) answer_.tier = chunk["tier"];
  std::string out;
  if (!chunk.contains("choices") || !chunk["choices"].is_array()) return out;
  for (const auto& choice : chunk["choices"]) {
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
      answer_.finish_reason = choice["finish_reason"];
    const ojson d = choice.value("delta", ojson::object());
    if (d.contains("reasoning_content") && d["reasoning_content"].is_string() &&
        !d["reasoning_content"].get<std::string>().empty())
      out += Reasoning(d["reasoning_content"]);
    if (d.contains("content") && d["content"].is_string() && !d["content"].get<std::string>().empty())
      out += Content(d["content"]);
    if (d.contains("tool_calls") && d["tool_calls"].is_array())
      for (const auto& t : d["tool_calls"]) out += ToolCall(t);
  }
  return out;
}

std::string ResponseEventWriter::Finish(const ojson& final_response) {
  std::string out = CloseOpenItem();
  const std::string status = final_response.value("status", std::string("completed"));
  return out + Event(status == "incomplete" ? "response.incomplete" : "response.completed", {{"response", final_response}});
}

std::string ResponseEventWriter::Error(const ojson& error_body) {
  const ojson e = error_body.value("error", ojson::object());
  return Event("error", {{"code", e.value("code", ojson())}, {"message", e.value("message", std::string("error"))},
                         {"param", e.value("param", ojson())}});
}

}  // namespace moeserve::daemon

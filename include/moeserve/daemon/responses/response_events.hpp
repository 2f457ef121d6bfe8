// The semantic events of a streamed response, made from the chat-completion
// chunks ChatService streams: response.created and response.in_progress,
// then for each output item in the order the model writes it
// response.output_item.added, its parts and deltas
// (reasoning_summary_part/-text, content_part/output_text,
// function_call_arguments) and their .done events, response.output_item.done,
// and finally response.completed (or response.incomplete). Every event
// carries a sequence_number counting from 0, in the shapes the official
// `openai` client's ResponseStream accumulates.
//
// Thread safety: none; the exchange that owns it serialises the calls.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/responses/response_output.hpp"

namespace moeserve::daemon {

class ResponseEventWriter {
 public:
  // The SSE text of response.created and response.in_progress for `shell`.
  std::string Start(const nlohmann::ordered_json& shell);
  // One chat.completion.chunk: the events its deltas make (possibly none).
  std::string Chunk(const nlohmann::ordered_json& chunk);
  // Closes the open item and sends response.completed (or .incomplete) with
  // `final_response`, whose output must be output().
  std::string Finish(const nlohmann::ordered_json& final_response);
  // An error event (the stream ends after it).
  std::string Error(const nlohmann::ordered_json& error_body);

  // Closes the item still open (so output() is whole) and returns its events.
  std::string CloseOpenItem();
  // The items made so far, with their final contents.
  const nlohmann::ordered_json& output() const { return output_; }
  // The answer the chunks carried (for the stored conversation and usage).
  const ChatAnswer& answer() const { return answer_; }

 private:
  enum class Open { kNone, kReasoning, kMessage, kCall };
  std::string Event(const std::string& type, nlohmann::ordered_json fields);
  std::string OpenItem(Open kind, nlohmann::ordered_json item);
  std::string Reasoning(const std::string& delta);
  std::string Content(const std::string& delta);
  std::string ToolCall(const nlohmann::ordered_json& delta);

  int64_t sequence_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Open open_ = Open::kNone;
  std::string item_id_;
  int64_t call_index_ = -1;  // the chat tool-call index of the open function_call
  ChatAnswer answer_;
};

}  // namespace moeserve::daemon

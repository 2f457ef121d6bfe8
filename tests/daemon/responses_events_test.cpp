// daemon.responses_events: the semantic events a streamed response is made
// of (response_events.hpp), from chat chunks of reasoning, text and two tool
// calls: each event's `event:` line is its type, sequence numbers count from
// 0 with no gap, every item is added, filled by deltas at its own
// output_index and done once, and the final output is what the deltas built.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/responses/response_events.hpp"

namespace moeserve::daemon {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<ojson> Events(const std::string& sse) {
  std::vector<ojson> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string block = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = block.find('\n');
    EXPECT_TRUE(block.starts_with("event: ") && nl != std::string::npos && block.compare(nl + 1, 6, "data: ") == 0) << block;
    ojson e = ojson::parse(block.substr(nl + 7));
    EXPECT_EQ(block.substr(7, nl - 7), e["type"].get<std::string>());
    out.push_back(std::move(e));
  }
  return out;
}

ojson Delta(ojson delta, ojson finish = nullptr) {
  return {{"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish}}}}};
}

TEST(ResponsesEvents, ChunksBecomeTheSemanticEventSequence) {
  ResponseEventWriter w;
  const ojson shell = {{"id", "resp_local_x"}, {"object", "response"}, {"status", "in_progress"}, {"output", ojson::array()}};
  std::string sse = w.Start(shell);
  sse += w.Chunk(Delta({{"reasoning_content", "Use "}}));
  sse += w.Chunk(Delta({{"reasoning_content", "calc."}}));
  sse += w.Chunk(Delta({{"content", "Sure"}}));
  sse += w.Chunk(Delta({{"content", ""}}));  // an empty delta makes no event
  sse += w.Chunk(Delta({{"tool_calls", {{{"index", 0}, {"id", "call_a"}, {"type", "function"},
                                        {"function", {{"name", "calculator"}, {"arguments", "{\"e\":"}}}}}}}));
  sse += w.Chunk(Delta({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "\"1+1\"}"}}}}}}}));
  sse += w.Chunk(Delta({{"tool_calls", {{{"index", 1}, {"id", "call_b"}, {"type", "function"},
                                        {"function", {{"name", "lookup"}, {"arguments", "{}"}}}}}}}));
  sse += w.Chunk(Delta(ojson::object(), "tool_calls"));
  sse += w.Chunk({{"choices", ojson::array()}, {"usage", {{"prompt_tokens", 9}, {"completion_tokens", 7}}}, {"tier", "low"}});
  sse += w.CloseOpenItem();
  ojson final_response = shell;
  final_response["status"] = "completed";
  final_response["output"] = w.output();
  sse += w.Finish(final_response);

  const auto events = Events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    types.push_back(events[i]["type"]);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.reasoning_summary_part.added",
      "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
      "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, expected);

  // Each delta lands on the item it names; the items end as the deltas built them.
  const ojson& out = w.output();
  ASSERT_EQ(out.size(), 4u);
  std::vector<std::string> built(4);
  for (const auto& e : events) {
    if (e.contains("delta")) built[e["output_index"].get<size_t>()] += e["delta"].get<std::string>();
    if (e["type"] == "response.output_item.added") EXPECT_EQ(e["item"]["id"], out[e["output_index"].get<size_t>()]["id"]);
  }
  EXPECT_EQ(built[0], out[0]["summary"][0]["text"]);
  EXPECT_EQ(built[0], "Use calc.");
  EXPECT_EQ(built[1], out[1]["content"][0]["text"]);
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(built[2], out[2]["arguments"]);
  EXPECT_EQ(out[2]["arguments"], "{\"e\":\"1+1\"}");
  EXPECT_EQ(out[2]["call_id"], "call_a");
  EXPECT_EQ(out[3]["name"], "lookup");
  EXPECT_EQ(out[3]["status"], "completed");
  EXPECT_EQ(events.back()["response"]["output"], out);
  // The answer, for the stored conversation and usage.
  EXPECT_EQ(w.answer().reasoning, "Use calc.");
  EXPECT_EQ(w.answer().content, "Sure");
  ASSERT_EQ(w.answer().calls.size(), 2u);
  EXPECT_EQ(w.answer().calls[1].call_id, "call_b");
  EXPECT_EQ(w.answer().finish_reason, "tool_calls");
  EXPECT_EQ(w.answer().usage["prompt_tokens"], 9);
  EXPECT_EQ(w.answer().tier, "low");
}

TEST(ResponsesEvents, AnIncompleteAnswerAndAnErrorEvent) {
  ResponseEventWriter w;
  std::string sse = w.Start({{"id", "r"}, {"output", ojson::array()}});
  sse += w.Chunk(Delta({{"content", "cut"}}, "length"));
  sse += w.Finish({{"id", "r"}, {"status", "incomplete"}});
  sse += w.Error({{"error", {{"code", "internal_error"}, {"message", "boom"}, {"param", nullptr}}}});
  const auto events = Events(sse);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2]["type"], "response.incomplete");
  EXPECT_EQ(events.back()["type"], "error");
  EXPECT_EQ(events.back()["code"], "internal_error");
  EXPECT_EQ(events.back()["message"], "boom");
  EXPECT_EQ(events.back()["sequence_number"], events.size() - 1);
}

}  // namespace
}  // namespace moeserve::daemon

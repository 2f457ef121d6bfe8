// daemon.responses_request: POST /v1/responses bodies translated into the
// chat path's body (response_request.hpp): what each field becomes, errors
// of the chat path renamed into the Responses request's terms, and refusals
// that name the field: wrong types, unsupported items and tools, and hostile
// bodies (huge input arrays, deep nesting, many keys) refused before they
// are walked.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/responses/response_output.hpp"
#include "moeserve/daemon/responses/response_request.hpp"

namespace moeserve::daemon {
namespace {

using ojson = nlohmann::ordered_json;

ResponsesRequest Parse(const ojson& body) {
  auto r = ParseResponsesRequest(body.dump());
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? *r : ResponsesRequest{};
}

ApiError Refusal(const std::string& body) {
  auto r = ParseResponsesRequest(body);
  EXPECT_FALSE(r.has_value()) << body.substr(0, 200);
  return r ? ApiError{} : r.error();
}

const ojson kCalculator = {{"type", "function"},
                           {"name", "calculator"},
                           {"description", "Evaluates arithmetic"},
                           {"parameters", {{"type", "object"}, {"properties", {{"expression", {{"type", "string"}}}}}}},
                           {"strict", true}};

TEST(ResponsesRequest, AStringInputIsOneUserMessageAfterTheInstructions) {
  auto req = Parse({{"model", "m"}, {"input", "hi"}, {"instructions", "Be brief."}, {"max_output_tokens", 50},
                    {"reasoning", {{"effort", "high"}}}, {"temperature", 0}});
  const ojson chat = ChatBodyFor(req, ojson::array());
  EXPECT_EQ(chat["model"], "m");
  ASSERT_EQ(chat["messages"].size(), 2u);
  EXPECT_EQ(chat["messages"][0], (ojson{{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(chat["messages"][1], (ojson{{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(chat["max_completion_tokens"], 50);
  EXPECT_EQ(chat["reasoning_effort"], "high");
  EXPECT_EQ(chat["temperature"], 0.0);
  EXPECT_FALSE(chat.contains("stream"));
}

TEST(ResponsesRequest, MinimalEffortIsTheLowTier) {
  auto req = Parse({{"input", "hi"}, {"reasoning", {{"effort", "minimal"}}}});
  EXPECT_EQ(ChatBodyFor(req, ojson::array())["reasoning_effort"], "low");
}

TEST(ResponsesRequest, ItemsBecomeChatMessagesWithCallsAndResults) {
  const ojson input = ojson::array({
      {{"role", "developer"}, {"content", "Use tools."}},
      {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "6*"}}, {{"type", "input_text"}, {"text", "7?"}}}}},
      {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", {{{"type", "summary_text"}, {"text", "Use calculator."}}}}},
      {{"type", "function_call"}, {"call_id", "call_a"}, {"name", "calculator"}, {"arguments", "{\"expression\":\"6*7\"}"}},
      {{"type", "function_call"}, {"call_id", "call_b"}, {"name", "calculator"}, {"arguments", "{}"}},
      {{"type", "function_call_output"}, {"call_id", "call_a"}, {"output", "42"}},
      {{"type", "function_call_output"}, {"call_id", "call_b"}, {"output", "0"}},
      {{"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "42"}}}}},
  });
  auto req = Parse({{"input", input}, {"tools", {kCalculator}}, {"tool_choice", {{"type", "function"}, {"name", "calculator"}}}});
  const ojson chat = ChatBodyFor(req, ojson::array());
  const ojson& m = chat["messages"];
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], (ojson{{"role", "system"}, {"content", "Use tools."}}));
  EXPECT_EQ(m[1]["content"], "6*7?");
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_EQ(m[2]["reasoning_content"], "Use calculator.");
  ASSERT_EQ(m[2]["tool_calls"].size(), 2u);  // both calls in one assistant message
  EXPECT_EQ(m[2]["tool_calls"][1]["id"], "call_b");
  EXPECT_EQ(m[3], (ojson{{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "42"}}));
  EXPECT_EQ(m[5], (ojson{{"role", "assistant"}, {"content", "42"}}));
  EXPECT_EQ(req.message_params[3], "input[5]");
  // Tools: the chat shape, strict kept; a named choice.
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "calculator");
  EXPECT_EQ(chat["tools"][0]["function"]["strict"], true);
  EXPECT_EQ(chat["tool_choice"], (ojson{{"type", "function"}, {"function", {{"name", "calculator"}}}}));
}

TEST(ResponsesRequest, HistoryComesBetweenInstructionsAndTheNewInput) {
  const ojson history = ojson::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}});
  auto req = Parse({{"input", "c"}, {"instructions", "sys"}, {"previous_response_id", "resp_local_x"}});
  const ojson m = ChatBodyFor(req, history)["messages"];
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["content"], "sys");
  EXPECT_EQ(m[1]["content"], "a");
  EXPECT_EQ(m[3]["content"], "c");
}

TEST(ResponsesRequest, JsonSchemaFormatAndStreaming) {
  const ojson schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  auto req = Parse({{"input", "x"}, {"stream", true},
                    {"text", {{"format", {{"type", "json_schema"}, {"name", "s"}, {"schema", schema}, {"strict", true}}}}}});
  const ojson chat = ChatBodyFor(req, ojson::array());
  EXPECT_EQ(chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(chat["response_format"]["json_schema"]["schema"], schema);
  EXPECT_EQ(chat["response_format"]["json_schema"]["strict"], true);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
}

TEST(ResponsesRequest, StoreDefaultsToTrueAndBackgroundNeedsIt) {
  EXPECT_TRUE(Parse({{"input", "x"}}).store);
  EXPECT_EQ(Refusal(R"({"input":"x","background":true,"store":false})").param, "background");
  EXPECT_EQ(Refusal(R"({"input":"x","background":true,"stream":true})").param, "stream");
}

struct BadCase {
  const char* body;
  const char* param;
};

TEST(ResponsesRequest, RefusalsNameTheField) {
  const BadCase cases[] = {
      {R"({})", "input"},
      {R"({"input":5})", "input"},
      {R"({"input":[]})", "input"},
      {R"({"input":[7]})", "input[0]"},
      {R"({"input":[{"role":"user"}]})", "input[0].content"},
      {R"({"input":[{"role":"robot","content":"x"}]})", "input[0].role"},
      {R"({"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})", "input[0].content[0].type"},
      {R"({"input":[{"role":"assistant","content":[{"type":"input_image","image_url":"data:x"}]}]})", "input[0].content[0].type"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","file_id":"file-1"}]}]})", "input[0].content[0].file_id"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:x","detail":"max"}]}]})", "input[0].content[0].detail"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image"}]}]})", "input[0].content[0].image_url"},
      {R"({"input":[{"role":"user","content":[{"type":"input_text","text":3}]}]})", "input[0].content[0].text"},
      {R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id"},
      {R"({"input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]})", "input[0].arguments"},
      {R"({"input":[{"type":"function_call_output","call_id":"c"}]})", "input[0].output"},
      {R"({"input":[{"type":"item_reference","id":"msg_1"}]})", "input[0].type"},
      {R"({"input":[{"type":"computer_call"}]})", "input[0].type"},
      {R"({"input":"x","tools":[{"type":"web_search_preview"}]})", "tools[0].type"},
      {R"({"input":"x","tools":[{"type":"file_search","vector_store_ids":[]}]})", "tools[0].type"},
      {R"({"input":"x","tools":[{"type":"function"}]})", "tools[0].name"},
      {R"({"input":"x","tools":[{"type":"function","name":"f","parameters":[]}]})", "tools[0].parameters"},
      {R"({"input":"x","tools":[{"type":"function","name":"f","strict":"yes"}]})", "tools[0].strict"},
      {R"({"input":"x","tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}]})", "tools[1].name"},
      {R"({"input":"x","tool_choice":"sometimes"})", "tool_choice"},
      {R"({"input":"x","tool_choice":{"type":"function","name":"g"}})", "tool_choice.name"},
      {R"({"input":"x","tool_choice":{"type":"web_search_preview"}})", "tool_choice.type"},
      {R"({"input":"x","reasoning":{"effort":"extreme"}})", "reasoning.effort"},
      {R"({"input":"x","reasoning":"high"})", "reasoning"},
      {R"({"input":"x","max_output_tokens":0})", "max_output_tokens"},
      {R"({"input":"x","max_output_tokens":"10"})", "max_output_tokens"},
      {R"({"input":"x","temperature":"hot"})", "temperature"},
      {R"({"input":"x","text":{"format":{"type":"json_schema","name":"s"}}})", "text.format.schema"},
      {R"({"input":"x","text":{"format":{"type":"xml"}}})", "text.format.type"},
      {R"({"input":"x","store":"yes"})", "store"},
      {R"({"input":"x","truncation":"auto"})", "truncation"},
      {R"({"input":"x","previous_response_id":7})", "previous_response_id"},
      {R"({"input":"x","metadata":{"k":1}})", "metadata.k"},
      {R"({"input":"x","instructions":["a"]})", "instructions"},
  };
  for (const auto& c : cases) {
    const ApiError e = Refusal(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_NE(e.message.find(c.param), std::string::npos) << e.message;
  }
}

TEST(ResponsesRequest, HostileBodiesAreRefusedBeforeTheyAreWalked) {
  // More items than any context holds: refused by count, naming input.
  std::string many = R"({"input":[)";
  for (size_t i = 0; i <= kMaxResponseInputItems; ++i) many += std::string(i ? "," : "") + R"({"role":"user","content":"x"})";
  many += "]}";
  const ApiError e = Refusal(many);
  EXPECT_EQ(e.param, "input");
  EXPECT_NE(e.message.find(std::to_string(kMaxResponseInputItems + 1) + " items"), std::string::npos) << e.message;
  // Nesting far past any schema, inside an item: the scan refuses it before
  // anything recursive runs, and names where.
  std::string deep = R"({"input":[{"type":"function_call_output","call_id":"c","output":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}]}";
  const ApiError d = Refusal(deep);
  EXPECT_EQ(d.status, 400);
  EXPECT_TRUE(d.param.starts_with("input[0].output")) << d.param << ": " << d.message;
  // An object with a huge number of keys (quadratic for ordered parsing).
  std::string keys = R"({"input":"x","metadata":{)";
  for (int i = 0; i < 20000; ++i) keys += std::string(i ? "," : "") + "\"k" + std::to_string(i) + "\":\"v\"";
  keys += "}}";
  EXPECT_EQ(Refusal(keys).status, 400);
  // Not JSON, not an object, invalid UTF-8.
  EXPECT_EQ(Refusal("{\"input\":").status, 400);
  EXPECT_EQ(Refusal("[1,2]").status, 400);
  EXPECT_EQ(Refusal("{\"input\":\"\xff\xfe\"}").status, 400);
  EXPECT_EQ(Refusal("").status, 400);
}

TEST(ResponsesRequest, ChatErrorsAreRenamedIntoTheRequestsTerms) {
  auto req = Parse({{"input", ojson::array({{{"role", "user"}, {"content", "a"}},
                                            {{"type", "function_call_output"}, {"call_id", "call_x"}, {"output", "1"}}})},
                    {"instructions", "sys"}});
  const size_t history = 2;  // messages[1..2] are the previous response's
  auto renamed = [&](const std::string& param) {
    return RenameChatError(ApiError::InvalidRequest("'" + param + "': bad", param), req, history).param;
  };
  EXPECT_EQ(renamed("messages[0].content"), "instructions");
  EXPECT_EQ(renamed("messages[2].content"), "previous_response_id");
  EXPECT_EQ(renamed("messages[3].content"), "input[0].content");
  EXPECT_EQ(renamed("messages[4].tool_call_id"), "input[1].call_id");
  EXPECT_EQ(renamed("messages"), "input");
  EXPECT_EQ(renamed("tools[2].function.parameters"), "tools[2].parameters");
  EXPECT_EQ(renamed("response_format.json_schema.schema"), "text.format.schema");
  EXPECT_EQ(renamed("max_completion_tokens"), "max_output_tokens");
  const ApiError e = RenameChatError(ApiError::InvalidRequest("'tools[0].function.parameters': no", "tools[0].function.parameters"), req, 0);
  EXPECT_EQ(e.message, "'tools[0].parameters': no");
}

TEST(ResponsesRequest, InputImagePartsBecomeChatImageParts) {
  auto req = Parse({{"input", ojson::array({{{"role", "user"},
                                             {"content", ojson::array({{{"type", "input_text"}, {"text", "read "}},
                                                                       {{"type", "input_image"},
                                                                        {"image_url", "data:image/png;base64,AAAA"},
                                                                        {"detail", "low"}},
                                                                       {{"type", "input_text"}, {"text", " now"}}})}},
                                            {{"type", "function_call"}, {"call_id", "c1"}, {"name", "shot"}, {"arguments", "{}"}},
                                            {{"type", "function_call_output"},
                                             {"call_id", "c1"},
                                             {"output", ojson::array({{{"type", "input_image"},
                                                                      {"image_url", "data:image/png;base64,BBBB"}}})}}})}});
  ASSERT_EQ(req.messages.size(), 3u);
  const ojson expected_user = ojson::array(
      {{{"type", "text"}, {"text", "read "}},
       {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AAAA"}, {"detail", "low"}}}},
       {{"type", "text"}, {"text", " now"}}});
  EXPECT_EQ(req.messages[0]["content"], expected_user);
  EXPECT_EQ(req.messages[2]["content"][0]["image_url"]["url"], "data:image/png;base64,BBBB");
  // A chat error about a part's URL names the input_image's image_url (in a
  // function_call_output, its output[j]).
  auto renamed = [&](const std::string& param) {
    return RenameChatError(ApiError::InvalidRequest("'" + param + "': bad", param), req, 0);
  };
  EXPECT_EQ(renamed("messages[0].content[1].image_url.url").param, "input[0].content[1].image_url");
  EXPECT_EQ(renamed("messages[0].content[1].image_url.url").message, "'input[0].content[1].image_url': bad");
  EXPECT_EQ(renamed("messages[2].content[0].image_url.url").param, "input[2].output[0].image_url");
}

TEST(ResponsesOutput, AnAnswerBecomesTypedItemsAndUsage) {
  const ojson completion = {
      {"choices", {{{"finish_reason", "tool_calls"},
                    {"message", {{"content", nullptr}, {"reasoning_content", "think"},
                                 {"tool_calls", {{{"id", "call_1"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}}}},
      {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 5}, {"prompt_tokens_details", {{"cached_tokens", 4}}},
                 {"completion_tokens_details", {{"reasoning_tokens", 2}}}}},
      {"tier", "low"}};
  const ChatAnswer a = ChatAnswerFrom(completion);
  const ojson items = OutputItems(a);
  ASSERT_EQ(items.size(), 2u) << items.dump();  // no empty message beside a call
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["summary"][0]["text"], "think");
  EXPECT_EQ(items[1]["type"], "function_call");
  EXPECT_EQ(items[1]["call_id"], "call_1");
  EXPECT_EQ(items[1]["status"], "completed");
  const ojson usage = ResponseUsage(a.usage);
  EXPECT_EQ(usage, (ojson{{"input_tokens", 10}, {"input_tokens_details", {{"cached_tokens", 4}}}, {"output_tokens", 5},
                          {"output_tokens_details", {{"reasoning_tokens", 2}}}, {"total_tokens", 15}}));
  ojson response = ResponseShell("resp_local_x", 1, "m", Parse({{"input", "hi"}}), "in_progress");
  ChatAnswer cut = a;
  cut.finish_reason = "length";
  FinishResponse(response, items, cut);
  EXPECT_EQ(response["status"], "incomplete");
  EXPECT_EQ(response["incomplete_details"]["reason"], "max_output_tokens");
}

}  // namespace
}  // namespace moeserve::daemon

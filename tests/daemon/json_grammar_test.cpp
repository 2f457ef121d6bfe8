// The schema grammar and DecodePolicy, driven by random logits over the full
// vocabulary (bytes, specials and padding) as a random-weight model would:
// every output must be a well-formed call (or object) that satisfies the schema.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "moeserve/chat/moe_dsa_v1/decode_policy.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::daemon {
namespace {

using ojson = nlohmann::ordered_json;
namespace tok = engine::tok;

const ojson kWeatherSchema = ojson::parse(R"({
  "type": "object",
  "properties": {
    "city": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "precise": {"type": "boolean"},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat"]},
    "extra": {}
  },
  "required": ["city", "unit"]
})");

bool Accepts(const ojson& schema, const std::string& text) {
  auto g = engine::JsonGrammar::ForObjectSchema(schema);
  if (!g) return false;
  for (unsigned char c : text)
    if (!g->Feed(c)) return false;
  return g->Done();
}

TEST(JsonGrammar, AcceptsValidCompactObjects) {
  EXPECT_TRUE(Accepts(kWeatherSchema, R"({"city":"Paris","unit":"celsius"})"));
  EXPECT_TRUE(Accepts(kWeatherSchema, R"({"unit":"fahrenheit","city":"","days":-12,"tags":["a","b"]})"));
  EXPECT_TRUE(Accepts(kWeatherSchema, R"({"city":"x","unit":"celsius","where":{"lat":1.5},"precise":false,"extra":null})"));
  EXPECT_TRUE(Accepts(kWeatherSchema, R"({"city":"Zürich \"q\"","unit":"celsius","tags":[]})"));
  EXPECT_TRUE(Accepts(ojson::object(), R"({"a":{"b":[1,true,"x"]}})"));
  EXPECT_TRUE(Accepts(ojson::object(), R"({})"));
}

// Found by fuzz_json_grammar: a required key missing from "properties" could
// never be written, so the grammar finished objects that break the schema.
TEST(JsonGrammar, RequiredKeysNotDeclaredMustStillBeWritten) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["b","b"]})");
  EXPECT_FALSE(Accepts(schema, R"({"a":"x"})"));
  EXPECT_TRUE(Accepts(schema, R"({"a":"x","b":[1]})"));
  EXPECT_TRUE(Accepts(schema, R"({"b":null})"));
  const ojson no_properties = ojson::parse(R"({"type":"object","required":["k"]})");
  EXPECT_FALSE(Accepts(no_properties, R"({})"));
  EXPECT_TRUE(Accepts(no_properties, R"({"k":{"x":1}})"));
  EXPECT_TRUE(engine::CheckAgainstSchema(ojson::parse(R"({"k":1})"), no_properties).has_value());
}

// Found by fuzz_json_grammar: the grammar wrote a required key that
// "properties" does not declare, and the schema check then called that key
// undeclared. Both now take it with any value; other extra keys stay refused.
// Found by fuzz_json_grammar: a declared key containing a quote is written
// escaped (\"), and the grammar took that quote for the key's end and stuck.
TEST(JsonGrammar, KeysWithEscapedQuotesCanBeWritten) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"a\"b":{"type":"integer"},"a":{"type":"integer"}},"required":["a\"b"]})");
  EXPECT_TRUE(Accepts(schema, R"({"a\"b":1})"));
  EXPECT_TRUE(Accepts(schema, R"({"a":2,"a\"b":1})"));
  EXPECT_FALSE(Accepts(schema, R"({"a\"c":1})"));
  EXPECT_FALSE(Accepts(schema, R"({"a":2})"));
}

TEST(JsonGrammar, CheckAgreesWithTheGrammarOnRequiredKeysNotDeclared) {
  const ojson schema = ojson::parse(
      R"({"type":"object","properties":{"kity":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})");
  const std::string written = R"({"city":"Paris","days":4})";
  EXPECT_TRUE(Accepts(schema, written));
  EXPECT_TRUE(engine::CheckAgainstSchema(ojson::parse(written), schema).has_value());
  EXPECT_FALSE(engine::CheckAgainstSchema(ojson::parse(R"({"city":1,"town":"x"})"), schema).has_value());
  EXPECT_FALSE(engine::CheckAgainstSchema(ojson::parse(R"({"days":4})"), schema).has_value());
}

TEST(JsonGrammar, RefusesWhatTheSchemaForbids) {
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"Paris"})"));                    // required unit
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"P","unit":"kelvin"})"));         // enum
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":1,"unit":"celsius"})"));          // type
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"a","unit":"celsius","x":1})"));  // undeclared key
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"a","city":"b","unit":"celsius"})"));  // repeated key
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"a","unit":"celsius","days":1.5})"));  // integer
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"a","unit":"celsius","tags":[1]})"));  // items
  EXPECT_FALSE(Accepts(kWeatherSchema, R"({"city":"a","unit":"celsius","tags":["a",]})"));
  EXPECT_FALSE(Accepts(kWeatherSchema, R"( {"city":"a","unit":"celsius"})"));  // no whitespace
  EXPECT_FALSE(Accepts(kWeatherSchema, "{\"city\":\"\xC0\xAF\",\"unit\":\"celsius\"}"));  // overlong UTF-8
  EXPECT_FALSE(Accepts(ojson{{"type", "string"}}, R"("x")"));
  EXPECT_FALSE(engine::JsonGrammar::ForObjectSchema(ojson{{"type", "array"}}).has_value());
}

// Samples like a model with random weights: random logits, masked, then the
// best survivor. Returns the emitted tokens (forced ones included).
std::vector<int> Drive(DecodePolicy& policy, uint64_t seed, int max_tokens, int vocab = 300) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<int> out;
  std::vector<int> pending;
  int think_left = static_cast<int>(seed % 5);  // a short thinking span, then the engine closes it
  while (static_cast<int>(out.size()) < max_tokens) {
    int token;
    if (!pending.empty()) {
      token = pending.front();
      pending.erase(pending.begin());
    } else if (think_left-- == 0) {
      token = tok::kEndThink;  // what the engine's thinking budget forces
    } else {
      std::vector<float> logits(vocab);
      for (auto& l : logits) l = normal(rng);
      policy.Mask(logits);
      token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      EXPECT_FALSE(std::isinf(logits[token])) << "every token was masked";
    }
    out.push_back(token);
    auto forced = policy.OnToken(token);
    pending.insert(pending.end(), forced.begin(), forced.end());
    if (token == tok::kEnd || token == tok::kEos) break;
  }
  return out;
}

TEST(DecodePolicy, NamedToolOnRandomLogitsAlwaysSatisfiesTheSchema) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    DecodePolicyOptions o;
    o.mode = DecodeMode::kMustCall;
    o.tools = {{"get_weather", kWeatherSchema}};
    o.parallel_calls = false;
    o.id_seed = seed;
    auto policy = DecodePolicy::Create(o);
    ASSERT_TRUE(policy.has_value());
    auto tokens = Drive(**policy, seed, 2000);
    ASSERT_EQ(tokens.back(), tok::kEnd) << "seed " << seed;
    OutputAssembler a;
    for (int t : tokens) a.OnToken(t, false);
    a.Finish();
    ASSERT_EQ(a.tool_calls().size(), 1u) << "seed " << seed;
    const auto& call = a.tool_calls()[0];
    EXPECT_EQ(call.name, "get_weather");
    EXPECT_TRUE(call.id.starts_with("call_") && call.id.size() == 29) << call.id;
    auto args = ojson::parse(call.arguments, nullptr, false);
    ASSERT_FALSE(args.is_discarded()) << "seed " << seed << ": " << call.arguments;
    auto ok = engine::CheckAgainstSchema(args, kWeatherSchema);
    EXPECT_TRUE(ok.has_value()) << "seed " << seed << ": " << (ok ? "" : ok.error().message());
    EXPECT_TRUE(a.content().empty());
  }
}

TEST(DecodePolicy, RequiredWithSeveralToolsAndParallelCalls) {
  const ojson calc = ojson::parse(R"({"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]})");
  for (uint64_t seed = 0; seed < 100; ++seed) {
    DecodePolicyOptions o;
    o.mode = DecodeMode::kMustCall;
    o.tools = {{"calculator", calc}, {"get_weather", kWeatherSchema}};
    o.id_seed = seed;
    auto policy = DecodePolicy::Create(o);
    ASSERT_TRUE(policy.has_value());
    auto tokens = Drive(**policy, seed + 1000, 3000);
    ASSERT_EQ(tokens.back(), tok::kEnd);
    OutputAssembler a;
    for (int t : tokens) a.OnToken(t, false);
    ASSERT_GE(a.tool_calls().size(), 1u);
    ASSERT_LE(a.tool_calls().size(), 4u);
    for (const auto& call : a.tool_calls()) {
      auto args = ojson::parse(call.arguments, nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << call.arguments;
      EXPECT_TRUE(engine::CheckAgainstSchema(args, call.name == "calculator" ? calc : kWeatherSchema).has_value()) << call.arguments;
    }
  }
}

TEST(DecodePolicy, JsonObjectModeGivesAnObject) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    DecodePolicyOptions o;
    o.mode = DecodeMode::kJsonObject;
    auto policy = DecodePolicy::Create(o);
    ASSERT_TRUE(policy.has_value());
    auto tokens = Drive(**policy, seed, 2000);
    ASSERT_EQ(tokens.back(), tok::kEnd);
    OutputAssembler a;
    for (int t : tokens) a.OnToken(t, false);
    auto v = ojson::parse(a.content(), nullptr, false);
    ASSERT_TRUE(v.is_object()) << a.content();
  }
}

TEST(DecodePolicy, NoToolsMasksToolCallAndFreeModeForcesIds) {
  DecodePolicyOptions o;
  o.mode = DecodeMode::kNoTools;
  auto none = DecodePolicy::Create(o);
  EXPECT_FALSE((*none)->Allows(tok::kToolCall));
  EXPECT_TRUE((*none)->Allows('a'));
  o.mode = DecodeMode::kFree;
  auto free = DecodePolicy::Create(o);
  EXPECT_TRUE((*free)->Allows(tok::kToolCall));
  auto forced = (*free)->OnToken(tok::kToolCall);
  std::string text(forced.begin(), forced.end());
  EXPECT_TRUE(text.starts_with("{\"id\":\"call_")) << text;
  EXPECT_TRUE(text.ends_with("\",")) << text;
}

}  // namespace
}  // namespace moeserve::daemon

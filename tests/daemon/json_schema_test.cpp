// daemon.json_schema: the schema keywords agent frameworks emit (anyOf,
// $defs/$ref with bounded recursion, additionalProperties, const, ranges,
// lengths, item counts), as accepted and refused byte sequences; strict
// refusals that name the keyword; and DecodePolicy on random logits, whose
// every answer must satisfy the schema.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>

#include "moeserve/chat/moe_dsa_v1/decode_policy.hpp"
#include "moeserve/engine/json_grammar.hpp"
#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"
#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/tokenizer.hpp"

namespace moeserve::daemon {
namespace {

using ojson = nlohmann::ordered_json;
namespace tok = engine::tok;

bool Accepts(const ojson& schema, const std::string& text) {
  auto g = engine::JsonGrammar::ForObjectSchema(schema);
  EXPECT_TRUE(g.has_value()) << schema.dump() << ": " << (g ? "" : g.error().message());
  if (!g) return false;
  for (unsigned char c : text)
    if (!g->Feed(c)) return false;
  return g->Done();
}

// {"v": <value>} under {"type":"object","properties":{"v":<value_schema>},"required":["v"]}
bool AcceptsValue(const std::string& value_schema, const std::string& value) {
  ojson schema = ojson::parse(R"({"type":"object","required":["v"],"properties":{"v":)" + value_schema + "}}");
  const std::string text = "{\"v\":" + value + "}";
  const bool accepted = Accepts(schema, text);
  // The check agrees with the grammar on every case here.
  EXPECT_EQ(accepted, engine::CheckAgainstSchema(ojson::parse(text), schema).has_value()) << value_schema << " " << value;
  return accepted;
}

TEST(JsonSchema, AnyOf) {
  const std::string s = R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":3},{"type":"null"}]})";
  EXPECT_TRUE(AcceptsValue(s, "12"));
  EXPECT_TRUE(AcceptsValue(s, R"("abc")"));
  EXPECT_TRUE(AcceptsValue(s, "null"));
  EXPECT_FALSE(AcceptsValue(s, R"("abcd")"));
  EXPECT_FALSE(AcceptsValue(s, "true"));
  EXPECT_FALSE(AcceptsValue(s, "1.5"));
  // Alternatives that read the same digits: one stops, the other goes on.
  const std::string n = R"({"anyOf":[{"const":1},{"type":"integer","minimum":10}]})";
  EXPECT_TRUE(AcceptsValue(n, "1"));
  EXPECT_TRUE(AcceptsValue(n, "10"));
  EXPECT_TRUE(AcceptsValue(n, "123"));
  EXPECT_FALSE(AcceptsValue(n, "5"));
  // Objects as alternatives (a tagged union).
  const std::string u = R"({"anyOf":[
    {"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind","x"],"additionalProperties":false},
    {"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"boolean"}},"required":["kind","y"],"additionalProperties":false}]})";
  EXPECT_TRUE(AcceptsValue(u, R"({"kind":"a","x":3})"));
  EXPECT_TRUE(AcceptsValue(u, R"({"kind":"b","y":true})"));
  EXPECT_FALSE(AcceptsValue(u, R"({"kind":"a","y":true})"));
  EXPECT_FALSE(AcceptsValue(u, R"({"kind":"b"})"));
}

TEST(JsonSchema, RefsAndDefs) {
  const ojson schema = ojson::parse(R"({"$defs":{"Unit":{"type":"string","enum":["c","f"]},
    "Temp":{"type":"object","properties":{"value":{"type":"number"},"unit":{"$ref":"#/$defs/Unit"}},"required":["value","unit"]}},
    "type":"object","properties":{"now":{"$ref":"#/$defs/Temp"},"unit":{"$ref":"#/$defs/Unit"}},"required":["now"]})");
  EXPECT_TRUE(Accepts(schema, R"({"now":{"value":21.5,"unit":"c"}})"));
  EXPECT_TRUE(Accepts(schema, R"({"unit":"f","now":{"unit":"f","value":-3}})"));
  EXPECT_FALSE(Accepts(schema, R"({"now":{"value":21.5,"unit":"k"}})"));
  EXPECT_FALSE(Accepts(schema, R"({"now":{"value":21.5}})"));
  const ojson definitions = ojson::parse(R"({"definitions":{"a~/b":{"type":"integer"}},"properties":{"x":{"$ref":"#/definitions/a~0~1b"}}})");
  EXPECT_TRUE(Accepts(definitions, R"({"x":4})"));
  EXPECT_FALSE(Accepts(definitions, R"({"x":"4"})"));
}

// A tree: "#" re-entered at most max_recursion (3) times along one path.
TEST(JsonSchema, RecursionIsBounded) {
  const ojson tree = ojson::parse(R"({"type":"object","additionalProperties":false,"required":["name"],
    "properties":{"name":{"type":"string","maxLength":2},"children":{"type":"array","items":{"$ref":"#"}}}})");
  EXPECT_TRUE(Accepts(tree, R"({"name":"a","children":[{"name":"b","children":[{"name":"c"}]},{"name":"x"}]})"));
  EXPECT_TRUE(Accepts(tree, R"({"name":"a","children":[{"name":"b","children":[{"name":"c","children":[{"name":"d","children":[]}]}]}]})"));
  EXPECT_FALSE(Accepts(tree, R"({"name":"a","children":[{"name":"b","children":[{"name":"c","children":[{"name":"d","children":[{"name":"e"}]}]}]}]})"));
  // A recursion the value can never leave: refused, saying why.
  auto endless = engine::JsonGrammar::ForObjectSchema(ojson::parse(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})"));
  ASSERT_FALSE(endless.has_value());
  EXPECT_NE(endless.error().message().find("recurses"), std::string::npos) << endless.error().message();
  // Mutual recursion through $defs, bounded the same way.
  const ojson mutual = ojson::parse(R"({"$defs":{"A":{"type":"object","properties":{"b":{"$ref":"#/$defs/B"}}},
    "B":{"type":"object","properties":{"a":{"$ref":"#/$defs/A"}}}},"type":"object","properties":{"a":{"$ref":"#/$defs/A"}}})");
  EXPECT_TRUE(Accepts(mutual, R"({"a":{"b":{"a":{"b":{}}}}})"));
  EXPECT_FALSE(Accepts(mutual, R"({"a":{"b":{"a":{"b":{"a":{"b":{"a":{"b":{"a":{}}}}}}}}}})"));
}

TEST(JsonSchema, AdditionalPropertiesAndConst) {
  EXPECT_FALSE(AcceptsValue(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})", R"({"b":1})"));
  const std::string map = R"({"type":"object","additionalProperties":{"type":"integer","minimum":0}})";
  EXPECT_TRUE(AcceptsValue(map, R"({"x":1,"y":2})"));
  EXPECT_FALSE(AcceptsValue(map, R"({"x":"1"})"));
  EXPECT_FALSE(AcceptsValue(map, R"({"x":-1})"));
  EXPECT_TRUE(AcceptsValue(R"({"type":"object","additionalProperties":false})", "{}"));
  EXPECT_FALSE(AcceptsValue(R"({"type":"object","additionalProperties":false})", R"({"x":1})"));
  EXPECT_TRUE(AcceptsValue(R"({"const":"x"})", R"("x")"));
  EXPECT_FALSE(AcceptsValue(R"({"const":"x"})", R"("y")"));
  EXPECT_TRUE(AcceptsValue(R"({"const":{"a":[1,2]}})", R"({"a":[1,2]})"));
}

TEST(JsonSchema, NumberRanges) {
  const std::string i = R"({"type":"integer","minimum":-5,"maximum":250})";
  for (const char* ok : {"-5", "0", "7", "250", "-1"}) EXPECT_TRUE(AcceptsValue(i, ok)) << ok;
  for (const char* bad : {"-6", "251", "1000", "-50", "2.5"}) EXPECT_FALSE(AcceptsValue(i, bad)) << bad;
  const std::string n = R"({"type":"number","exclusiveMinimum":0,"maximum":1})";
  for (const char* ok : {"0.5", "1", "0.0001", "1.0"}) EXPECT_TRUE(AcceptsValue(n, ok)) << ok;
  for (const char* bad : {"0", "1.0001", "-0.1", "0.0"}) EXPECT_FALSE(AcceptsValue(n, bad)) << bad;
  // A range past the default six digits widens them.
  EXPECT_TRUE(AcceptsValue(R"({"type":"integer","minimum":1700000000})", "1700000001"));
  EXPECT_FALSE(AcceptsValue(R"({"type":"integer","minimum":1700000000})", "170000000"));
  // No integer in the range: refused.
  EXPECT_FALSE(engine::JsonGrammar::ForObjectSchema(ojson::parse(R"({"properties":{"v":{"type":"integer","minimum":0.2,"maximum":0.8}}})")).has_value());
}

TEST(JsonSchema, StringLengthsAndItemCounts) {
  const std::string s = R"({"type":"string","minLength":3,"maxLength":5})";
  EXPECT_TRUE(AcceptsValue(s, R"("abc")"));
  EXPECT_TRUE(AcceptsValue(s, "\"\xC3\xA9\xC3\xA9\xC3\xA9\""));  // characters, not bytes
  EXPECT_TRUE(AcceptsValue(s, R"("a\nbcd")"));
  EXPECT_FALSE(AcceptsValue(s, R"("ab")"));
  EXPECT_FALSE(AcceptsValue(s, R"("abcdef")"));
  // minLength above the byte bound (32 by default) raises it.
  EXPECT_TRUE(AcceptsValue(R"({"type":"string","minLength":40})", "\"" + std::string(40, 'x') + "\""));
  EXPECT_FALSE(engine::JsonGrammar::ForObjectSchema(ojson::parse(R"({"properties":{"v":{"type":"string","minLength":4,"maxLength":2}}})")).has_value());
  const std::string a = R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})";
  EXPECT_FALSE(AcceptsValue(a, "[1]"));
  EXPECT_TRUE(AcceptsValue(a, "[1,2]"));
  EXPECT_TRUE(AcceptsValue(a, "[1,2,3]"));
  EXPECT_FALSE(AcceptsValue(a, "[1,2,3,4]"));
  EXPECT_TRUE(AcceptsValue(R"({"type":"array","minItems":6})", "[1,2,3,4,5,6]"));
}

TEST(JsonSchema, StrictRefusesWhatIsNotEnforcedNamingIt) {
  struct Case {
    const char* schema;
    const char* names;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"type":"object","properties":{"when":{"type":"string","format":"date-time"}}})", "$.properties.when.format"},
           {R"({"type":"object","properties":{"id":{"type":"string","pattern":"^(?=a)[a-z]+$"}}})", "$.properties.id.pattern"},
           {R"({"type":"object","properties":{"id":{"type":"string","pattern":"(a)\\1"}}})", "$.properties.id.pattern"},
           {R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+$","maxLength":3}}})", "$.properties.id.pattern"},
           {R"({"type":"object","properties":{"x":{"oneOf":[{"type":"string"}]}}})", "$.properties.x.oneOf"},
           {R"({"type":"object","properties":{"x":{"type":"string","anyOf":[{"minLength":1}]}}})", "$.properties.x.type"},
           {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})", "$.additionalProperties"},
           {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/Missing"}}})", "$.properties.a.$ref"},
           {R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":5}}})", "$.properties.n.multipleOf"},
           {R"({"type":"object","properties":{"t":{"type":"array","items":[{"type":"string"}]}}})", "$.properties.t.items"},
           {R"({"type":"object","$defs":{"D":{"type":"string","format":"email"}}})", "$.$defs.D.format"},
       }) {
    const ojson schema = ojson::parse(c.schema);
    auto strict = engine::JsonGrammar::ForObjectSchema(schema, {}, true);
    ASSERT_FALSE(strict.has_value()) << c.schema;
    EXPECT_NE(strict.error().message().find(c.names), std::string::npos) << strict.error().message();
    // Without strict the keyword is passed over, as before.
    EXPECT_TRUE(engine::JsonGrammar::ForObjectSchema(schema).has_value()) << c.schema;
  }
  // What agent frameworks emit under strict is accepted.
  const ojson pydantic = ojson::parse(R"({"$defs":{"Unit":{"enum":["c","f"],"title":"Unit","type":"string"}},
    "properties":{"city":{"title":"City","type":"string","minLength":1},"unit":{"$ref":"#/$defs/Unit"},
    "days":{"anyOf":[{"type":"integer","minimum":1,"maximum":14},{"type":"null"}],"default":null,"title":"Days"}},
    "required":["city","unit","days"],"title":"Weather","type":"object","additionalProperties":false})");
  EXPECT_TRUE(engine::JsonGrammar::ForObjectSchema(pydantic, {}, true).has_value());
}

// Samples like a model with random weights: random logits, masked, then the
// best survivor; the engine closes the reasoning at once.
std::string DriveJson(DecodePolicy& policy, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  OutputAssembler a;
  std::vector<int> pending = {tok::kEndThink};
  for (int step = 0; step < 5000; ++step) {
    int token;
    if (!pending.empty()) {
      token = pending.front();
      pending.erase(pending.begin());
    } else {
      std::vector<float> logits(300);
      for (auto& l : logits) l = normal(rng);
      policy.Mask(logits);
      token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      EXPECT_FALSE(std::isinf(logits[token])) << "every token was masked";
    }
    a.OnToken(token, false);
    auto forced = policy.OnToken(token);
    pending.insert(pending.end(), forced.begin(), forced.end());
    if (token == tok::kEnd) return a.content();
  }
  ADD_FAILURE() << "no end after 5000 tokens";
  return a.content();
}

TEST(JsonSchema, RandomLogitsAlwaysSatisfyTheSchema) {
  const ojson schema = ojson::parse(R"({"$defs":{"Node":{"type":"object","additionalProperties":false,"required":["id"],
      "properties":{"id":{"type":"integer","minimum":1,"maximum":99},"kids":{"type":"array","items":{"$ref":"#/$defs/Node"},"maxItems":2}}}},
    "type":"object","additionalProperties":false,"required":["name","kind","score","tree","tags"],
    "properties":{"name":{"type":"string","minLength":2,"maxLength":6},
      "kind":{"anyOf":[{"const":"a"},{"type":"integer","exclusiveMinimum":-3,"maximum":3},{"type":"null"}]},
      "score":{"type":"number","minimum":-1.5,"maximum":2.25},
      "tree":{"$ref":"#/$defs/Node"},
      "tags":{"type":"array","items":{"type":"string","maxLength":2},"minItems":1,"maxItems":5},
      "extra":{"type":"object","additionalProperties":{"type":"boolean"}}}})");
  for (uint64_t seed = 0; seed < 150; ++seed) {
    DecodePolicyOptions o;
    o.mode = DecodeMode::kJsonObject;
    o.response_schema = schema;
    o.response_strict = true;
    auto policy = DecodePolicy::Create(o);
    ASSERT_TRUE(policy.has_value()) << policy.error().message();
    const std::string text = DriveJson(**policy, seed);
    if (seed < 3) std::printf("seed %d: %s\n", static_cast<int>(seed), text.c_str());
    auto v = ojson::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << "seed " << seed << ": " << text;
    auto ok = engine::CheckAgainstSchema(v, schema);
    EXPECT_TRUE(ok.has_value()) << "seed " << seed << ": " << text << ": " << (ok ? "" : ok.error().message());
  }
}

// Patterns: the grammar against std::regex (ECMAScript, the dialect JSON
// Schema names) as an independent judge.
bool RegexSearch(const std::string& pattern, const std::string& s) {
  return std::regex_search(s, std::regex(pattern, std::regex::ECMAScript));
}

TEST(JsonSchema, PatternsAcceptWhatTheRegexMatches) {
  struct Case {
    std::string pattern;
    std::vector<std::string> strings;
  };
  const std::vector<Case> cases = {
      {"^[a-z]+$", {"abc", "", "ab1", "Z", "zz"}},
      {"^\\d{3}-\\d{4}$", {"555-1234", "55-1234", "555-12345", "abc-defg"}},
      {"^(?:[A-Z]{2}|x)_[0-9a-f]*$", {"AB_ff", "x_", "A_1", "AB_g", "xx_1"}},
      {"^[^@\\s]+@[^@\\s]+\\.[a-z]{2,3}$", {"a@b.io", "a@b.c", "a b@c.de", "a@@b.com", "me@host.com"}},
      {"ab?c", {"zac", "abbc", "xabcx", "ac", "bc"}},
      {"^\\w+\\.(json|yaml)$", {"cfg.json", "cfg.yml", ".json", "a_b.yaml"}},
      {"^\"[\\\\/]*\"$", {"\"\"", "\"\\/\"", "x", "\"a\""}},
      {"^a{2,}b{0,1}$", {"aa", "aaab", "ab", "aabb"}},
  };
  for (const auto& c : cases) {
    const std::string schema = nlohmann::json({{"type", "string"}, {"pattern", c.pattern}}).dump();
    for (const auto& str : c.strings) {
      const std::string value = nlohmann::json(str).dump();
      EXPECT_EQ(AcceptsValue(schema, value), RegexSearch(c.pattern, str)) << c.pattern << " on " << value;
    }
  }
  // A pattern that needs more bytes than the string bound raises it.
  EXPECT_TRUE(AcceptsValue(R"({"type":"string","pattern":"^x{40}$"})", "\"" + std::string(40, 'x') + "\""));
  // Refused: nothing printable matches, non-ASCII, anchors inside '|'.
  for (const char* p : {"^\\n$", "^é$", "^a|b$", "(?<n>a)", "a**"}) {
    auto g = engine::JsonGrammar::ForObjectSchema(ojson{{"properties", {{"v", {{"type", "string"}, {"pattern", p}}}}}}, {}, true);
    EXPECT_FALSE(g.has_value()) << p;
  }
}

// Random logits through pattern strings: every answer matches (std::regex).
TEST(JsonSchema, RandomLogitsMatchThePatterns) {
  const ojson schema = ojson::parse(R"({"type":"object","additionalProperties":false,"required":["phone","mail","tag"],
    "properties":{"phone":{"type":"string","pattern":"^\\+?\\d{2,3}[ -]\\d{4}$"},
      "mail":{"type":"string","pattern":"^[a-z0-9._]+@[a-z]+\\.(com|org)$"},
      "tag":{"type":"string","pattern":"v[0-9]\"?\\\\"}}})");
  for (uint64_t seed = 0; seed < 100; ++seed) {
    DecodePolicyOptions o;
    o.mode = DecodeMode::kJsonObject;
    o.response_schema = schema;
    o.response_strict = true;
    auto policy = DecodePolicy::Create(o);
    ASSERT_TRUE(policy.has_value()) << policy.error().message();
    const std::string text = DriveJson(**policy, seed);
    auto v = ojson::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << "seed " << seed << ": " << text;
    EXPECT_TRUE(RegexSearch("^\\+?\\d{2,3}[ -]\\d{4}$", v["phone"])) << text;
    EXPECT_TRUE(RegexSearch("^[a-z0-9._]+@[a-z]+\\.(com|org)$", v["mail"])) << text;
    EXPECT_TRUE(RegexSearch("v[0-9]\"?\\\\", v["tag"])) << text;
    if (seed < 2) std::printf("seed %d: %s\n", static_cast<int>(seed), text.c_str());
  }
}

}  // namespace
}  // namespace moeserve::daemon

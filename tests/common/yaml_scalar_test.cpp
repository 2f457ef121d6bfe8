// common.yaml_scalar: what kind each scalar is, and the checked reads that
// refuse null, blank text and the wrong kind with the path (never the value).
#include <gtest/gtest.h>

#include "moeserve/common/yaml_scalar.hpp"

namespace moeserve::yaml {
namespace {

YAML::Node Value(const std::string& text) { return YAML::Load("v: " + text)["v"]; }

TEST(YamlScalar, KindsFollowTheCoreSchemaAndQuotesMakeText) {
  for (const char* t : {"", "~", "null", "Null", "NULL", "!!null ''"}) EXPECT_EQ(KindOf(Value(t)), ScalarKind::kNull) << t;
  for (const char* t : {"true", "False", "YES", "no", "on", "Off", "y", "N"}) EXPECT_EQ(KindOf(Value(t)), ScalarKind::kBoolean) << t;
  for (const char* t : {"0", "-3", "+7", "0x1F", "0o17", "!!int 5"}) EXPECT_EQ(KindOf(Value(t)), ScalarKind::kInteger) << t;
  for (const char* t : {"1.5", "-0.25", "1e3", ".5", ".inf", "-.Inf", ".nan"}) EXPECT_EQ(KindOf(Value(t)), ScalarKind::kFloat) << t;
  for (const char* t : {"word", "\"8000\"", "'true'", "\"null\"", "!!str 5", "sk-live-1", "1.2.3", "0x", "|\n  text"})
    EXPECT_EQ(KindOf(Value(t)), ScalarKind::kText) << t;
}

TEST(YamlScalar, TextRefusesNullBlankCollectionsAndOtherKinds) {
  EXPECT_EQ(*Text(Value("sk-a"), "f.key"), "sk-a");
  EXPECT_EQ(*Text(Value("\"12345\""), "f.key"), "12345");
  const std::pair<const char*, const char*> cases[] = {
      {"", "f.key: must be text, not null (omit the key to keep its default)"},
      {"~", "f.key: must be text, not null (omit the key to keep its default)"},
      {"null", "f.key: must be text, not null (omit the key to keep its default)"},
      {"\"\"", "f.key: must be text, not empty text"},
      {"\"  \\t \"", "f.key: must be text, not whitespace-only text"},
      {"{a: 1}", "f.key: must be text, not a map"},
      {"[a]", "f.key: must be text, not a list"},
      {"12345", "f.key: must be text, not an integer (quote it to use it as text)"},
      {"yes", "f.key: must be text, not a boolean (quote it to use it as text)"},
  };
  for (const auto& [yaml, message] : cases) {
    auto r = Text(Value(yaml), "f.key");
    ASSERT_FALSE(r) << yaml;
    EXPECT_EQ(r.error().message(), message);
  }
  // The value is never repeated: it may be a secret.
  auto secret = Text(Value("98765432101234"), "keys[0].key");
  ASSERT_FALSE(secret);
  EXPECT_EQ(secret.error().message().find("98765432101234"), std::string::npos);
}

TEST(YamlScalar, NumbersAndBooleans) {
  EXPECT_EQ(*Integer(Value("0x10"), "n"), 16);
  EXPECT_EQ(*Integer(Value("-9223372036854775808"), "n"), INT64_MIN);
  EXPECT_FALSE(Integer(Value("9223372036854775808"), "n"));
  EXPECT_EQ(Integer(Value("70000"), "port", 1, 65535).error().message(), "port: must be between 1 and 65535");
  EXPECT_EQ(Integer(Value("1.5"), "port").error().message(), "port: must be an integer, not a number");
  EXPECT_EQ(Integer(Value("\"80\""), "port").error().message(), "port: must be an integer, not text");
  EXPECT_DOUBLE_EQ(*Number(Value("5"), "s"), 5.0);
  EXPECT_DOUBLE_EQ(*Number(Value("2.5e-1"), "s"), 0.25);
  EXPECT_EQ(Number(Value(".nan"), "s").error().message(), "s: must be a finite number");
  EXPECT_EQ(Number(Value("~"), "s").error().message(), "s: must be a number, not null (omit the key to keep its default)");
  EXPECT_TRUE(*Boolean(Value("Yes"), "b"));
  EXPECT_FALSE(*Boolean(Value("off"), "b"));
  EXPECT_EQ(Boolean(Value("1"), "b").error().message(), "b: must be true or false, not an integer");
  EXPECT_EQ(Boolean(Value("\"true\""), "b").error().message(), "b: must be true or false, not text");
}

TEST(YamlScalar, KeysMustBeNames) {
  auto root = YAML::Load("{~: 1, '': 2, ' ': 3, [a]: 4, name: 5, 7: 6}");
  std::vector<std::string> ok, refused;
  for (const auto& kv : root) {
    auto k = Key(kv.first, "doc");
    if (k) ok.push_back(*k);
    else refused.push_back(k.error().message());
  }
  EXPECT_EQ(ok, (std::vector<std::string>{"name", "7"}));
  EXPECT_EQ(refused.size(), 4u);
  for (const auto& m : refused) EXPECT_TRUE(m.starts_with("doc: a key must be a name, not ")) << m;
}

}  // namespace
}  // namespace moeserve::yaml

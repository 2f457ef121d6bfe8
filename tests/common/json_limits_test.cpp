#include "moeserve/common/json_limits.hpp"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

using ojson = nlohmann::ordered_json;

std::string Nested(int depth, std::string_view inner = "1") {
  return std::string(depth, '[') + std::string(inner) + std::string(depth, ']');
}

TEST(JsonLimits, ExactDepthIsAcceptedOneMoreIsRefused) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 8};
  auto ok = ParseJsonBounded(Nested(8), limits, "body");
  ASSERT_TRUE(ok) << ok.error().ToString();
  auto deep = ParseJsonBounded(Nested(9), limits, "body");
  ASSERT_FALSE(deep);
  EXPECT_EQ(deep.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(deep.error().message(),
            "body: nests objects and arrays more than 8 levels deep (at byte 8, under "
            "[0][0][0][0][0][0][0][0])");
  // Scalars are depth 0; a limit of 0 allows only them.
  EXPECT_TRUE(ParseJsonBounded("\"x\"", {.max_bytes = 10, .max_depth = 0}, "v"));
  EXPECT_FALSE(ParseJsonBounded("[]", {.max_bytes = 10, .max_depth = 0}, "v"));
  EXPECT_TRUE(ParseJsonBounded("[]", {.max_bytes = 10, .max_depth = 1}, "v"));
}

TEST(JsonLimits, ObjectsAndArraysCountAlike) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 3};
  EXPECT_TRUE(ParseJsonBounded(R"({"a":[{"b":1}],"c":{"d":[]}})", limits, "v"));
  EXPECT_FALSE(ParseJsonBounded(R"({"a":[{"b":{}}]})", limits, "v"));
  // Siblings do not add up: depth is what is open at once.
  EXPECT_TRUE(ParseJsonBounded(R"([[[1]],[[2]],[[3]],{"x":[]}])", limits, "v"));
}

TEST(JsonLimits, NestingInsideStringsIsText) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 2};
  std::string brackets(100000, '[');
  auto r = ParseJsonBounded<ojson>("{\"a\":\"" + brackets + "\"}", limits, "v");
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ((*r)["a"].get<std::string>(), brackets);
  // Keys are strings too.
  EXPECT_TRUE(ParseJsonBounded("{\"" + brackets + "\":[1]}", limits, "v"));
}

TEST(JsonLimits, EscapesDoNotEndStrings) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 2};
  // \" keeps the string open, so the brackets after it are text...
  EXPECT_TRUE(ParseJsonBounded(R"(["a\"[[[[[[", 1])", limits, "v"));
  // ...but \\ is a whole escape, so the quote after it closes the string and
  // the brackets that follow are real nesting.
  auto r = ParseJsonBounded(R"(["a\\",[[[[1]]]]])", limits, "v");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("more than 2 levels deep (at byte 8, under [1][0])"), std::string::npos)
      << r.error().message();
  // \u escapes hold no quote or backslash byte.
  EXPECT_TRUE(ParseJsonBounded(R"(["\u005c\u0022[[[["])", limits, "v"));
}

TEST(JsonLimits, PathNamesKeysAndIndices) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 3};
  auto v = FindJsonLimitViolation(R"({"messages":[{"role":"user","content":[{"x":1}]}]})", limits);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->kind, JsonLimitViolation::Kind::kTooDeep);
  EXPECT_EQ(JsonPathString("", v->path), "messages[0].content");
  EXPECT_EQ(JsonPathString("body", v->path), "body.messages[0].content");
  // A second element, and a key after an earlier key in the same object.
  v = FindJsonLimitViolation(R"({"a":1,"tools":[{},{"f":{"p":{}}}]})", limits);
  ASSERT_TRUE(v);
  EXPECT_EQ(JsonPathString("", v->path), "tools[1].f");
  // A string value is not mistaken for a key.
  v = FindJsonLimitViolation(R"({"k":"v","w":[[[1]]]})", limits);
  ASSERT_TRUE(v);
  EXPECT_EQ(JsonPathString("", v->path), "w[0][0]");
}

TEST(JsonLimits, DeepNestingIsRefusedWithoutRecursion) {
  // 100,000 levels, in and out of strings: the scan must neither recurse nor
  // let the parser build something a later dump() would recurse through.
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 64};
  auto r = ParseJsonBounded(Nested(100000), limits, "arguments");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("arguments: nests objects and arrays more than 64 levels deep (at byte 64"),
            std::string::npos)
      << r.error().message();
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}');
  EXPECT_FALSE(ParseJsonBounded(objects, limits, "v"));
}

TEST(JsonLimits, SizeLimitIsExact) {
  const JsonLimits limits{.max_bytes = 10, .max_depth = 4};
  EXPECT_TRUE(ParseJsonBounded("[1,2,3,44]", limits, "v"));  // 10 bytes
  auto r = ParseJsonBounded("[1,2,3,444]", limits, "file.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "file.json: is 11 bytes, more than the limit of 10");
  auto v = FindJsonLimitViolation("[1,2,3,444]", limits);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->kind, JsonLimitViolation::Kind::kTooLarge);
}

TEST(JsonLimits, InvalidJsonIsTheParsersError) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 4};
  auto r = ParseJsonBounded("{\"a\":", limits, "config.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message().rfind("config.json: not valid JSON: ", 0), 0u) << r.error().message();
  EXPECT_FALSE(ParseJsonBounded("", limits, "v"));
  EXPECT_FALSE(ParseJsonBounded("[1] x", limits, "v"));
  EXPECT_FALSE(ParseJsonBounded("\"\xff\"", limits, "v"));  // not UTF-8
  // Closing brackets first cannot buy depth: the scan stops where the text
  // stops being JSON, and the parser refuses it.
  EXPECT_FALSE(ParseJsonBounded("]]]]" + Nested(6), limits, "v"));
  EXPECT_FALSE(FindJsonLimitViolation("\"unterminated [[[[[[[", limits));
}

TEST(JsonLimits, BothJsonFlavoursParse) {
  const JsonLimits limits{.max_bytes = 100, .max_depth = 2};
  auto plain = ParseJsonBounded<nlohmann::json>(R"({"b":1,"a":[2]})", limits, "v");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->dump(), R"({"a":[2],"b":1})");
  auto ordered = ParseJsonBounded<ojson>(R"({"b":1,"a":[2]})", limits, "v");
  ASSERT_TRUE(ordered);
  EXPECT_EQ(ordered->dump(), R"({"b":1,"a":[2]})");
}

TEST(JsonLimits, KeysPerObjectExactLimitAcceptedOneMoreRefused) {
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = 8, .max_object_keys = 3};
  EXPECT_TRUE(ParseJsonBounded(R"({"a":{"x":1,"y":"k:","z":[{"p":1,"q":2,"r":3}]},"b":2,"c":3})", limits, "v"));
  auto r = ParseJsonBounded(R"({"a":[1,{"w":1,"x":"y","y":2,"z":3}]})", limits, "v");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "v: has an object with more than 3 keys (at byte 29, under a[1])");
  auto top = FindJsonLimitViolation(R"({"a":1,"b":2,"c":3,"d":4})", limits);
  ASSERT_TRUE(top);
  EXPECT_EQ(top->kind, JsonLimitViolation::Kind::kTooManyKeys);
  EXPECT_TRUE(top->path.empty());
  // Without the field set, keys are not counted.
  std::string many = "{";
  for (int i = 0; i < 1000; ++i) many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  EXPECT_TRUE(ParseJsonBounded(many + "}", {.max_bytes = 1 << 20, .max_depth = 2}, "v"));
}

TEST(JsonLimits, CheckJsonDepthWalksBuiltValues) {
  ojson v = ojson::parse(R"({"a":[1,{"b":[2]}],"c":{}})");  // depth 4
  EXPECT_TRUE(CheckJsonDepth(v, 4, "v"));
  auto r = CheckJsonDepth(v, 3, "span");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "span: nests objects and arrays more than 3 levels deep (under a[1].b)");
  EXPECT_TRUE(CheckJsonDepth(ojson(5), 0, "v"));
  EXPECT_FALSE(CheckJsonDepth(ojson::array(), 0, "v"));

  // 100,000 levels built in code (nlohmann builds and frees them iteratively).
  ojson deep = ojson::parse(Nested(100000));
  r = CheckJsonDepth(deep, 64, "deep");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("more than 64 levels deep"), std::string::npos);
  nlohmann::json plain = nlohmann::json::parse(Nested(65));
  EXPECT_FALSE(CheckJsonDepth(plain, 64, "plain"));
  EXPECT_TRUE(CheckJsonDepth(plain, 65, "plain"));
}

}  // namespace
}  // namespace moeserve

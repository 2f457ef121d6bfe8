#include "moeserve/common/yaml_limits.hpp"

#include <gtest/gtest.h>

#include <string>

namespace moeserve {
namespace {

constexpr YamlLimits kLimits{.max_bytes = 1 << 20, .max_depth = 8};

Status Check(const std::string& text, YamlLimits limits = kLimits) { return CheckYamlLimits(text, limits, "d.yaml"); }

// A map nested `depth` levels by indentation: k: / k: / ... / v: 1.
std::string BlockMaps(int depth) {
  std::string out;
  for (int i = 0; i + 1 < depth; ++i) out += std::string(2 * i, ' ') + "k:\n";
  return out + std::string(2 * (depth - 1), ' ') + "v: 1\n";
}

TEST(YamlLimits, FlowNestingExactLimitAcceptedOneMoreRefused) {
  // The top-level map is 1; each bracket adds one.
  EXPECT_TRUE(Check("a: " + std::string(7, '[') + std::string(7, ']') + "\n"));
  auto r = Check("x: 1\na: " + std::string(8, '{') + std::string(8, '}') + "\n");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message(), "d.yaml: line 2 nests collections more than 8 levels deep");
}

TEST(YamlLimits, BlockNestingExactLimitAcceptedOneMoreRefused) {
  EXPECT_TRUE(Check(BlockMaps(8)));
  auto r = Check(BlockMaps(9));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "d.yaml: line 9 nests collections more than 8 levels deep");
  // Siblings do not add up; dedenting closes collections.
  EXPECT_TRUE(Check(BlockMaps(8) + BlockMaps(8) + "top: [[[[1]]]]\n"));
}

TEST(YamlLimits, ItemsOnOneLineNest) {
  // "- - - x": a sequence in a sequence in a sequence, each item's node a level.
  std::string seven = "- - - - - - - x\n";  // 7 sequences + the scalar node = 8
  EXPECT_TRUE(Check(seven));
  EXPECT_FALSE(Check("- " + seven));
  // Block and flow nesting add up.
  EXPECT_FALSE(Check("- - - - a: [[[[1]]]]\n"));
}

TEST(YamlLimits, BracketsInQuotesAndCommentsAreText) {
  std::string deep(1000, '[');
  EXPECT_TRUE(Check("a: \"" + deep + "\"\n"));
  EXPECT_TRUE(Check("a: '" + deep + "'\n"));
  EXPECT_TRUE(Check("a: 1  # " + deep + "\n" + "# " + deep + "\n"));
  // Escapes: \" and '' keep the scalar open, so these brackets are still text.
  EXPECT_TRUE(Check("a: \"x\\\"" + deep + "\"\n"));
  EXPECT_TRUE(Check("a: 'it''s " + deep + "'\n"));
  // \\ closes nothing early: the quote after it ends the scalar, and the
  // brackets that follow are nesting.
  EXPECT_FALSE(Check("a: [\"x\\\\\", " + std::string(8, '[') + std::string(8, ']') + "]\n"));
  // A quoted scalar may run over several lines.
  EXPECT_TRUE(Check("a: \"one\n  " + deep + "\n  two\"\nb: 1\n"));
}

TEST(YamlLimits, BlockScalarTextIsTextButItsSiblingsAreNot) {
  std::string deep(1000, '[');
  EXPECT_TRUE(Check("a: |\n  " + deep + "\n  more\nb: 1\n"));
  EXPECT_TRUE(Check("- key: >-\n    " + deep + "\n"));
  // After the scalar ends (a line indented no more than its key), counting resumes.
  EXPECT_FALSE(Check("- key: |\n    text\n  other: " + deep + "\n"));
  // `x |` is a plain scalar, not a block scalar header: the next lines count.
  EXPECT_FALSE(Check("a: x |\n  " + deep + "\n"));
}

TEST(YamlLimits, QuotesInsideWordsDoNotHideBrackets) {
  // yaml-cpp reads `it's` as a plain scalar; a scan that took the quote as
  // the start of a quoted scalar would skip the brackets after it.
  EXPECT_FALSE(Check("a: [it's, " + std::string(8, '[') + std::string(8, ']') + "]\n"));
}

TEST(YamlLimits, FlowCollectionsSpanLines) {
  EXPECT_TRUE(Check("a: [\n  [1,\n   2],\n  {b: [3]}\n]\nc: 1\n"));
  EXPECT_FALSE(Check("a: [\n" + std::string(4, '[') + "\n" + std::string(4, '{') + "\n"));
}

TEST(YamlLimits, HundredThousandDeepIsRefusedQuickly) {
  EXPECT_FALSE(Check("a: " + std::string(100000, '[') + std::string(100000, ']')));
  std::string items;
  for (int i = 0; i < 100000; ++i) items += "- ";
  EXPECT_FALSE(Check(items + "x\n"));
}

TEST(YamlLimits, SizeLimitIsExact) {
  EXPECT_TRUE(Check("a: 12345\n", {.max_bytes = 9, .max_depth = 8}));
  auto r = Check("a: 123456\n", {.max_bytes = 9, .max_depth = 8});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "d.yaml: is 10 bytes, more than the limit of 9");
}

TEST(YamlLimits, EmptyAndCommentOnlyTexts) {
  EXPECT_TRUE(Check(""));
  EXPECT_TRUE(Check("# nothing\n\n   \n"));
  EXPECT_TRUE(Check("---\na: 1\n...\n"));
}

}  // namespace
}  // namespace moeserve

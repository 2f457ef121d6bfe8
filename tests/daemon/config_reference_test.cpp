// daemon.config_reference: docs/http-api.md's configuration reference lists
// exactly the keys the daemon's config parser accepts: every setting
// (config_settings.cpp) and every field of the pricing, budgets and hooks
// sections (budget_policy.hpp), and nothing else. A key added without a row
// in the docs, or a row left behind for a key that went, fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "daemon_harness.hpp"
#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/daemon/config_settings.hpp"

namespace moeserve::daemon {
namespace {

std::string ReadDocs() {
  std::ifstream in(testing::SourceRoot() + "/docs/http-api.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first cell of every table row under "### Reference", when it is one
// `key` in backticks.
std::set<std::string> DocumentedKeys(const std::string& docs) {
  const size_t start = docs.find("\n### Reference\n");
  const size_t end = docs.find("\n### ", start + 1);
  std::set<std::string> keys;
  if (start == std::string::npos) return keys;
  std::stringstream section(docs.substr(start, end == std::string::npos ? std::string::npos : end - start));
  static const std::regex row(R"(^\| `([^`]+)` \|.*)");
  for (std::string line; std::getline(section, line);) {
    std::smatch m;
    if (std::regex_match(line, m, row)) keys.insert(m[1]);
  }
  return keys;
}

std::set<std::string> ParserKeys() {
  std::set<std::string> keys;
  for (const auto& s : DaemonSettings()) keys.insert(std::string(s.key));
  for (auto f : kPricingFields) keys.insert("pricing.<tier>." + std::string(f));
  for (auto f : kBudgetFields) keys.insert("budgets[]." + std::string(f));
  for (auto f : kHookFields) keys.insert("hooks[]." + std::string(f));
  return keys;
}

TEST(ConfigReference, EveryKeyTheParserAcceptsIsDocumentedAndNothingElse) {
  const std::string docs = ReadDocs();
  ASSERT_FALSE(docs.empty()) << "docs/http-api.md not found under " << testing::SourceRoot();
  const auto documented = DocumentedKeys(docs);
  const auto accepted = ParserKeys();
  ASSERT_GT(accepted.size(), 60u);
  for (const auto& k : accepted) {
    EXPECT_TRUE(documented.contains(k)) << "'" << k << "' is accepted by the daemon's config parser but has no row in "
                                        << "docs/http-api.md's configuration reference (### Reference)";
  }
  for (const auto& k : documented) {
    EXPECT_TRUE(accepted.contains(k)) << "docs/http-api.md documents '" << k << "', which the config parser does not accept";
  }
}

// Each row says the type, the default, the range and the meaning.
TEST(ConfigReference, EveryRowHasATypeAndAMeaning) {
  const std::string docs = ReadDocs();
  const size_t start = docs.find("\n### Reference\n");
  ASSERT_NE(start, std::string::npos);
  std::stringstream section(docs.substr(start, docs.find("\n### ", start + 1) - start));
  static const std::regex row(R"(^\| `([^`]+)` \| ([^|]+) \|([^|]*)\|([^|]*)\| ([^|]+) \|$)");
  size_t rows = 0;
  for (std::string line; std::getline(section, line);) {
    if (!line.starts_with("| `")) continue;
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, row)) << "not | `key` | type | default | range | meaning |: " << line;
    if (m.empty()) continue;
    ++rows;
    static const std::regex type("text|integer|number|boolean|map|list of numbers");
    EXPECT_TRUE(std::regex_match(m[2].str(), type)) << line;
  }
  EXPECT_EQ(rows, ParserKeys().size());
}

}  // namespace
}  // namespace moeserve::daemon

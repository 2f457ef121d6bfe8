// daemon.config_reference: docs/http-api.md's configuration reference lists
// exactly the keys the daemon's config parser accepts: every setting
// (config_settings.cpp) and every field of the pricing, budgets and hooks
// sections (budget_policy.hpp), and nothing else. A key added without a row
// in the docs, or a row left behind for a key that went, fails here. Each
// setting's row is the settings table's row (type, default, range,
// meaning), `--help` lists every setting from that table, and the parser
// accepts both ends of every numeric range the table states and refuses
// what lies just outside.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "daemon_harness.hpp"
#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/daemon/config.hpp"
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

// Every row under "### Reference" as key -> {type, default, range, meaning}.
std::map<std::string, std::vector<std::string>> DocumentedRows(const std::string& docs) {
  const size_t start = docs.find("\n### Reference\n");
  std::map<std::string, std::vector<std::string>> rows;
  if (start == std::string::npos) return rows;
  std::stringstream section(docs.substr(start, docs.find("\n### ", start + 1) - start));
  for (std::string line; std::getline(section, line);) {
    if (!line.starts_with("| `") || !line.ends_with(" |")) continue;
    std::vector<std::string> cells;
    std::stringstream cols(line.substr(1, line.size() - 2));
    for (std::string cell; std::getline(cols, cell, '|');) {
      const size_t a = cell.find_first_not_of(' '), b = cell.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
    }
    if (cells.size() != 5) continue;  // EveryRowHasATypeAndAMeaning reports the shape
    const std::string key = cells[0].substr(1, cells[0].size() - 2);
    rows[key] = {cells.begin() + 1, cells.end()};
  }
  return rows;
}

TEST(ConfigReference, EachSettingsRowIsTheSettingsTablesRow) {
  const auto rows = DocumentedRows(ReadDocs());
  ASSERT_GT(DaemonSettings().size(), 60u);
  for (const SettingSpec& s : DaemonSettings()) {
    const std::string key(s.key);
    auto it = rows.find(key);
    ASSERT_NE(it, rows.end()) << key << " has no well-formed row in docs/http-api.md's reference";
    const std::vector<std::string> want = {std::string(SettingKindName(s.kind)), std::string(s.default_value),
                                           std::string(s.range), std::string(s.doc)};
    const char* column[] = {"type", "default", "range", "meaning"};
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(it->second[i], want[i]) << key << ": the docs' " << column[i]
                                        << " differs from config_settings.cpp's (the table is the source)";
  }
}

TEST(ConfigReference, HelpListsEverySettingFromTheTable) {
  const std::string help = ServeUsage();
  for (const SettingSpec& s : DaemonSettings()) {
    std::string flag(s.key);
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    EXPECT_NE(help.find("  --" + flag + " " + std::string(SettingKindName(s.kind)) + " (default "), std::string::npos)
        << flag;
  }
}

// A range "A to B" (numbers, or 2^N) is what the parser enforces: A and B
// are accepted, and the nearest values outside are refused.
TEST(ConfigReference, TheParserHoldsEveryNumericRangeTheTableStates) {
  static const std::regex range(R"(^(\d+(?:\.\d+)?|2\^\d+) to (\d+(?:\.\d+)?|2\^\d+)$)");
  auto value = [](const std::string& t) -> long double {
    return t.starts_with("2^") ? std::ldexp(1.0L, std::stoi(t.substr(2))) : std::stold(t);
  };
  int checked = 0;
  for (const SettingSpec& s : DaemonSettings()) {
    if (s.kind != SettingKind::kInteger && s.kind != SettingKind::kNumber) continue;
    // The three tiers are also ordered among themselves (low <= medium <=
    // high), so one set alone can break that order: config_scalars covers them.
    if (s.key.starts_with("thinking_budgets.")) continue;
    const std::string key(s.key), r(s.range);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(r, m, range)) << key << ": a numeric setting states its range as A to B, not '" << r << "'";
    const long double lo = value(m[1]), hi = value(m[2]);
    const bool integer = s.kind == SettingKind::kInteger;
    auto text = [&](long double v) {
      if (integer) return std::to_string(static_cast<long long>(v));
      std::ostringstream os;
      os.precision(17);
      os << static_cast<double>(v);
      return os.str();
    };
    auto parses = [&](long double v) { return ParseDaemonConfigYaml(key + ": " + text(v) + "\n", "test").has_value(); };
    EXPECT_TRUE(parses(lo)) << key << ": " << text(lo);
    EXPECT_TRUE(parses(hi)) << key << ": " << text(hi);
    EXPECT_FALSE(parses(integer ? lo - 1 : (lo == 0 ? -1 : lo / 2))) << key << " below " << text(lo);
    EXPECT_FALSE(parses(integer ? hi + 1 : hi * 2)) << key << " above " << text(hi);
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

}  // namespace
}  // namespace moeserve::daemon

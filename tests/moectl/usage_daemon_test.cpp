// moectl.usage_daemon: moectl usage against a real daemon (tiny model, in
// this process) that served known requests: the table, json and yaml rows
// match the tokens each response reported and the price table; a tenant's
// key sees only its own rows; GET /v1/usage/history answers the cumulative
// spend of the period with its access rules; `--chart` writes a PNG that
// cairo reads back, with the budget line drawn.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "../daemon/daemon_harness.hpp"
#include "moectl_support.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/moectl/spend_chart.hpp"

namespace moeserve::moectl::testing {
namespace {

using daemon::testing::Chat;
using daemon::testing::Http;
using daemon::testing::UserTurn;
using nlohmann::json;

const std::string kAcmeKey = "sk-acme-0123456789", kBetaKey = "sk-beta-0123456789", kAdminKey = "sk-admin-0123456789";

std::map<std::string, std::string> Bearer(const std::string& key) { return {{"Authorization", "Bearer " + key}}; }

// Every kind of token costs the same within a tier, so a request's cost is
// its total tokens times the tier's price whatever the prefix cache did.
constexpr double kLowUsdPerToken = 0.001, kMediumUsdPerToken = 0.002;

struct Served {
  int64_t prompt = 0, completion = 0, requests = 0;
  int64_t total() const { return prompt + completion; }
};

std::string Usd(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

class UsageFromDaemon : public daemon::testing::SharedDaemonSuite {
 protected:
  static void SetUpTestSuite() {
    daemon::DaemonConfig c = daemon::testing::TestConfig();
    c.api_keys_file = TempPath("keys.yaml");
    std::ofstream(c.api_keys_file) << "keys:\n  - {key: " << kAcmeKey << ", tenant: acme}\n  - {key: " << kBetaKey
                                   << ", tenant: beta}\n  - {key: " << kAdminKey << ", tenant: ops, role: admin}\n";
    auto parsed = daemon::ParseDaemonConfigYaml(R"(
pricing:
  low:    {input: 1000, cachedInput: 1000, output: 1000, reasoning: 1000}
  medium: {input: 2000, cachedInput: 2000, output: 2000, reasoning: 2000}
budgets:
  - {tenant: "*", period: day, limitUSD: 5, thresholds: [0.5, 1.0]}
)", "budget.yaml", c);
    ASSERT_TRUE(parsed) << parsed.error().ToString();
    StartShared(*parsed);
    ASSERT_NE(daemon_, nullptr);
    url_ = daemon_->url();
    auto ask = [](const std::string& key, const std::string& text, const std::string& effort, Served& s) {
      auto r = Chat(port_, {{"messages", UserTurn(text)}, {"max_tokens", 3}, {"reasoning_effort", effort}, {"seed", 3}},
                    Bearer(key));
      ASSERT_EQ(r.status, 200) << r.body;
      s.prompt += r.Json()["usage"]["prompt_tokens"].get<int64_t>();
      s.completion += r.Json()["usage"]["completion_tokens"].get<int64_t>();
      s.requests += 1;
    };
    ask(kAcmeKey, "hello there", "low", acme_);
    ask(kAcmeKey, "and a second question", "low", acme_);
    ask(kBetaKey, "beta asks once", "medium", beta_);
  }
  static json RowOf(const json& items, const std::string& tenant, const std::string& tier, const std::string& period) {
    for (const json& i : items)
      if (i["tenant"] == tenant && i["tier"] == tier && i["period"] == period) return i;
    return json();
  }
  inline static std::string url_;
  inline static Served acme_, beta_;
};

TEST_F(UsageFromDaemon, JsonRowsMatchTheServedTokensAndPrices) {
  auto r = Moectl({"usage", "--daemon", url_, "--api-key", kAdminKey, "-o", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["kind"], "UsageList");
  for (const char* period : {"day", "month"}) {
    json acme = RowOf(j["items"], "acme", "low", period);
    ASSERT_TRUE(acme.is_object()) << r.out;
    EXPECT_EQ(acme["requests"], acme_.requests);
    EXPECT_EQ(acme["tokens"]["input"].get<int64_t>() + acme["tokens"]["cachedInput"].get<int64_t>(), acme_.prompt);
    EXPECT_EQ(acme["tokens"]["output"].get<int64_t>() + acme["tokens"]["reasoning"].get<int64_t>(), acme_.completion);
    EXPECT_NEAR(acme["spentUSD"].get<double>(), acme_.total() * kLowUsdPerToken, 1e-9);
    json beta = RowOf(j["items"], "beta", "medium", period);
    ASSERT_TRUE(beta.is_object()) << r.out;
    EXPECT_EQ(beta["requests"], 1);
    EXPECT_NEAR(beta["spentUSD"].get<double>(), beta_.total() * kMediumUsdPerToken, 1e-9);
  }
  EXPECT_EQ(j["items"].size(), 4u);  // two tenants x one tier x two periods
}

TEST_F(UsageFromDaemon, YamlCarriesTheSameRows) {
  auto r = Moectl({"usage", "--daemon", url_ + "/v1", "--api-key", kAdminKey, "-o", "yaml"});
  ASSERT_EQ(r.rc, 0) << r.err;
  YAML::Node y = YAML::Load(r.out);
  ASSERT_EQ(y["kind"].as<std::string>(), "UsageList");
  int seen = 0;
  for (const auto& item : y["items"]) {
    if (item["tenant"].as<std::string>() != "beta" || item["period"].as<std::string>() != "day") continue;
    ++seen;
    EXPECT_EQ(item["tier"].as<std::string>(), "medium");
    EXPECT_NEAR(item["spentUSD"].as<double>(), beta_.total() * kMediumUsdPerToken, 1e-9);
    EXPECT_EQ(item["tokens"]["output"].as<int64_t>() + item["tokens"]["reasoning"].as<int64_t>(), beta_.completion);
  }
  EXPECT_EQ(seen, 1) << r.out;
}

TEST_F(UsageFromDaemon, TheTableShowsATenantsKeyOnlyItsOwnRows) {
  auto r = Moectl({"usage", "--daemon", url_}, {{"MOECTL_API_KEY", kAcmeKey}});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string header, line;
  std::getline(lines, header);
  EXPECT_EQ(header.rfind("TENANT", 0), 0u) << r.out;
  int rows = 0;
  while (std::getline(lines, line)) {
    std::istringstream cells(line);
    std::vector<std::string> c;
    for (std::string s; cells >> s;) c.push_back(s);
    ASSERT_EQ(c.size(), 10u) << line;
    EXPECT_EQ(c[0], "acme");
    EXPECT_EQ(c[1], "low");
    EXPECT_EQ(c[4], std::to_string(acme_.requests));
    EXPECT_EQ(std::stoll(c[5]) + std::stoll(c[6]), acme_.prompt);
    EXPECT_EQ(c[9], Usd(acme_.total() * kLowUsdPerToken));
    ++rows;
  }
  EXPECT_EQ(rows, 2) << r.out;  // day and month
}

TEST_F(UsageFromDaemon, HistoryIsTheCumulativeSpendOfThePeriodWithItsAccessRules) {
  auto own = Http(port_, "GET", "/v1/usage/history?period=day", "", Bearer(kAcmeKey));
  ASSERT_EQ(own.status, 200) << own.body;
  json h = own.Json();
  EXPECT_EQ(h["tenant"], "acme");
  EXPECT_EQ(h["period"], "day");
  ASSERT_FALSE(h["data"].empty());
  EXPECT_NEAR(h["data"].back()["cumulative_usd"].get<double>(), acme_.total() * kLowUsdPerToken, 1e-9);
  int64_t requests = 0;
  for (const json& p : h["data"]) requests += p["requests"].get<int64_t>();
  EXPECT_EQ(requests, acme_.requests);
  ASSERT_EQ(h["budgets"].size(), 1u);
  EXPECT_EQ(h["budgets"][0]["limit_usd"], 5.0);
  EXPECT_EQ(h["budgets"][0]["thresholds"], json({0.5, 1.0}));

  auto other = Http(port_, "GET", "/v1/usage/history?tenant=beta", "", Bearer(kAcmeKey));
  EXPECT_EQ(other.status, 403) << other.body;
  auto admin = Http(port_, "GET", "/v1/usage/history?tenant=beta&period=month", "", Bearer(kAdminKey));
  ASSERT_EQ(admin.status, 200) << admin.body;
  EXPECT_NEAR(admin.Json()["data"].back()["cumulative_usd"].get<double>(), beta_.total() * kMediumUsdPerToken, 1e-9);
  EXPECT_EQ(Http(port_, "GET", "/v1/usage/history", "", Bearer(kAdminKey)).status, 400);
  EXPECT_EQ(Http(port_, "GET", "/v1/usage/history?period=week", "", Bearer(kAcmeKey)).status, 400);
  EXPECT_EQ(Http(port_, "GET", "/v1/usage/history").status, 401);
}

TEST_F(UsageFromDaemon, ChartIsAPngWithTheBudgetLine) {
  const std::string png = TempPath("usage.png");
  auto r = Moectl({"usage", "--daemon", url_, "--api-key", kAdminKey, "--tenant", "acme", "--period", "day", "--chart",
                   png, "--size", "800x480"});
  ASSERT_EQ(r.rc, 0) << r.err;
  Image im;
  std::string error;
  ASSERT_TRUE(ReadPng(png, &im, &error)) << error;
  EXPECT_EQ(im.width, 800);
  EXPECT_EQ(im.height, 480);
  // The $5 limit is the highest value, so its line is the topmost red row of
  // the plot, and spans it.
  ChartLayout layout;
  const int x0 = layout.margin_left + 2, x1 = 800 - layout.margin_right;
  int budget_rows = 0;
  for (int y = layout.margin_top; y < 480 - layout.margin_bottom; ++y) {
    budget_rows += CountInRow(im, y, x0, x1, Rgb(ChartColors::kBudget)) >= (x1 - x0) * 9 / 10;
  }
  EXPECT_EQ(budget_rows, 2);  // one line, two pixels thick
  // The spend from the plot's left edge on: in the first minutes of a
  // period (this test run just after midnight UTC) its line is a rise over
  // the time axis's first pixels, drawn over the axis.
  int spend = 0;
  for (int y = layout.margin_top; y < 480 - layout.margin_bottom; ++y)
    spend += CountInRow(im, y, layout.margin_left - 2, x1, Rgb(ChartColors::kSpend));
  EXPECT_GT(spend, 0);
}

}  // namespace
}  // namespace moeserve::moectl::testing

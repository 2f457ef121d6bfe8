// operator.usage_totals: the arithmetic of the usage sync, by hand-computed
// tables. Growth between two reads of one ledger; a reset (another ledger id,
// or a count that went down) counts the new row from zero; a pod not read
// adds nothing and loses nothing; the global spend handed to a pod says how
// much of it came from that pod; alerts are decided once per threshold,
// never again once status or the ConfigMap holds them; the record survives
// its ConfigMap's JSON exactly.
#include <gtest/gtest.h>

#include "moeserve/operator/budget_record.hpp"
#include "moeserve/operator/usage_totals.hpp"

namespace moeserve::op {
namespace {

constexpr int64_t kNow = 1796385600;  // 2026-12-04T12:00:00Z
const int64_t kDay = PeriodStart(BudgetPeriod::kDay, kNow);
const int64_t kMonth = PeriodStart(BudgetPeriod::kMonth, kNow);

UsageAmount Usd(double usd, int64_t output = 0, int64_t requests = 0) {
  UsageAmount a;
  a.cost_usd = usd;
  a.tokens.output = output;
  a.requests = requests;
  return a;
}

UsageReading Reading(const std::string& ledger, std::vector<std::pair<UsageKey, UsageAmount>> rows) {
  UsageReading r{ledger, {}, {}};
  for (auto& [k, a] : rows) r.rows[k] = a;
  return r;
}

UsageKey Day(const std::string& tenant, const std::string& tier = "low") { return {tenant, tier, BudgetPeriod::kDay, kDay}; }

TEST(UsageTotals, GrowthIsTheDifferenceUnlessTheCounterWentDown) {
  EXPECT_EQ(Growth(Usd(2, 20, 2), Usd(5, 50, 5), true), Usd(3, 30, 3));
  // Another ledger: the new row counts whole.
  EXPECT_EQ(Growth(Usd(2, 20, 2), Usd(5, 50, 5), false), Usd(5, 50, 5));
  // Same ledger, but fewer tokens than before: a reset.
  EXPECT_EQ(Growth(Usd(2, 20, 2), Usd(3, 10, 3), true), Usd(3, 10, 3));
  EXPECT_EQ(Growth(Usd(2, 20, 2), Usd(1.5, 30, 3), true), Usd(1.5, 30, 3));
  EXPECT_EQ(Growth(Usd(2, 20, 2), Usd(2, 20, 2), true), Usd(0, 0, 0));
}

TEST(UsageTotals, TwoPodsSumAndEachReadAddsOnlyWhatGrew) {
  UsageTotals t;
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.0, 10, 1)}, {Day("acme", "high"), Usd(4.0, 5, 1)}}));
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(2.0, 20, 2)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 7.0);
  // The same readings again: nothing new.
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.0, 10, 1)}, {Day("acme", "high"), Usd(4.0, 5, 1)}}));
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(2.0, 20, 2)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 7.0);
  // a grows by 0.5 on low.
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.5, 15, 2)}, {Day("acme", "high"), Usd(4.0, 5, 1)}}));
  const PeriodSpend s = t.Spend("acme", BudgetPeriod::kDay, kDay);
  EXPECT_DOUBLE_EQ(s.spent_usd, 7.5);
  EXPECT_EQ(s.tokens.output, 40);
  EXPECT_DOUBLE_EQ(s.by_tier.at("low").second, 3.5);
  EXPECT_DOUBLE_EQ(s.by_tier.at("high").second, 4.0);
  EXPECT_DOUBLE_EQ(t.CountedFrom("ns/a-r0-0", "acme", BudgetPeriod::kDay, kDay), 5.5);
  EXPECT_DOUBLE_EQ(t.CountedFrom("ns/b-r0-0", "acme", BudgetPeriod::kDay, kDay), 2.0);
  EXPECT_DOUBLE_EQ(t.CountedFrom("ns/gone", "acme", BudgetPeriod::kDay, kDay), 0.0);
}

TEST(UsageTotals, APodReplacedWithoutItsVolumeIsNeitherLostNorCountedTwice) {
  UsageTotals t;
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(3.0, 30, 3)}}));
  // Replaced between two reads: a new ledger that has charged 0.25 since.
  t.Fold("ns/a-r0-0", Reading("L9", {{Day("acme"), Usd(0.25, 2, 1)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 3.25);
  // Next read of the new ledger: only its growth.
  t.Fold("ns/a-r0-0", Reading("L9", {{Day("acme"), Usd(1.0, 8, 2)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 4.0);
  EXPECT_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).tokens.output, 38);
  // The same id whose totals went down (a ledger restored from an older copy): a reset too.
  t.Fold("ns/a-r0-0", Reading("L9", {{Day("acme"), Usd(0.5, 4, 1)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 4.5);
}

TEST(UsageTotals, APodNotReadKeepsItsLastSeenAndIsCountedAtItsNextRead) {
  UsageTotals t;
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.0)}}));
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(1.0)}}));
  // b does not answer for two syncs while it charges 2.0 more.
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.5)}}));
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(1.5)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 2.5);
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(3.0)}}));
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kDay, kDay).spent_usd, 4.5);
}

TEST(UsageTotals, PastPeriodsArePrunedAndCurrentOnesKept) {
  UsageTotals t;
  const UsageKey yesterday{"acme", "low", BudgetPeriod::kDay, kDay - 86400};
  const UsageKey month{"acme", "low", BudgetPeriod::kMonth, kMonth};
  t.Fold("ns/a-r0-0", Reading("L1", {{yesterday, Usd(9)}, {Day("acme"), Usd(1)}, {month, Usd(10)}}));
  t.Prune(kNow);
  EXPECT_EQ(t.sum.size(), 2u);
  EXPECT_EQ(t.sum.count(yesterday), 0u);
  EXPECT_EQ(t.pods.at("ns/a-r0-0").rows.count(yesterday), 0u);
  EXPECT_DOUBLE_EQ(t.Spend("acme", BudgetPeriod::kMonth, kMonth).spent_usd, 10);
}

TEST(UsageTotals, ParsesTheDaemonsUsageAndRefusesHostileBodies) {
  nlohmann::json body = {{"object", "list"},
                         {"ledger_id", "ldg_1"},
                         {"data",
                          {{{"tenant", "acme"},
                            {"tier", "low"},
                            {"period", "day"},
                            {"period_start", Iso8601Utc(kDay)},
                            {"requests", 3},
                            {"tokens", {{"input", 1}, {"cached_input", 2}, {"output", 3}, {"reasoning", 4}}},
                            {"cost_usd", 0.5}}}}};
  auto r = ParseUsageReading(body);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->ledger_id, "ldg_1");
  EXPECT_EQ(r->rows.at(Day("acme")).tokens.reasoning, 4);
  EXPECT_DOUBLE_EQ(r->rows.at(Day("acme")).cost_usd, 0.5);
  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"cost_usd", -1}, {"cost_usd", "1"}, {"period", "week"}, {"period_start", "2026-12-04T00:00:01Z"},
           {"tenant", ""}, {"tokens", {{"input", -5}}}}) {
    nlohmann::json bad = body;
    bad["data"][0][field] = value;
    auto parsed = ParseUsageReading(bad);
    ASSERT_FALSE(parsed) << field;
    EXPECT_NE(parsed.error().message().find(field), std::string::npos) << parsed.error().message();
  }
  nlohmann::json no_id = body;
  no_id.erase("ledger_id");
  EXPECT_FALSE(ParseUsageReading(no_id));
  EXPECT_FALSE(ParseUsageReading(nlohmann::json::array()));
}

BudgetPolicy Policy() {
  BudgetPolicy p;
  p.policy_name = "team-a";
  p.deployment_name = "a,b";
  Budget b;
  b.tenant = "*";
  b.period = BudgetPeriod::kDay;
  b.limit_usd = 10;
  b.action = BudgetAction::kBlock;
  p.budgets.push_back(b);
  HookConfig h;
  h.name = "sre";
  h.url = "https://alerts.example/moe";
  p.hooks.push_back(h);
  return p;
}

TEST(BudgetRecord, EachThresholdIsDecidedOnceAcrossSyncsStatusAndRestarts) {
  UsageTotals t;
  t.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(4.99)}}));
  EXPECT_TRUE(NewAlerts(t, Policy(), {}, kNow).empty());
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(3.5)}}));  // 8.49: 50% and 80% at once
  auto fired = NewAlerts(t, Policy(), {}, kNow);
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_DOUBLE_EQ(fired[0].threshold, 0.5);
  EXPECT_DOUBLE_EQ(fired[1].threshold, 0.8);
  EXPECT_NE(fired[0].delivery_id, fired[1].delivery_id);
  EXPECT_FALSE(fired[0].delivered);
  auto body = nlohmann::json::parse(AlertBodyOf(fired[1], "team-a", HookFormat::kJson));
  EXPECT_EQ(body["type"], "budget.threshold");
  EXPECT_EQ(body["policy"], "team-a");
  EXPECT_EQ(body["deployment"], "a,b");
  EXPECT_DOUBLE_EQ(body["spent_usd"].get<double>(), 8.49);
  EXPECT_DOUBLE_EQ(body["budget_usd"].get<double>(), 10);
  // Known from the ConfigMap: nothing again.
  EXPECT_TRUE(NewAlerts(t, Policy(), fired, kNow).empty());
  // Known only from status (the ConfigMap lost): nothing again either.
  const auto from_status = ParseStatusAlerts(StatusAlerts(fired));
  ASSERT_EQ(from_status.size(), 2u);
  EXPECT_TRUE(NewAlerts(t, Policy(), from_status, kNow).empty());
  // Crossing 100% fires that one only.
  t.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(5.01)}}));
  auto last = NewAlerts(t, Policy(), from_status, kNow);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_DOUBLE_EQ(last[0].threshold, 1.0);
  // Tomorrow's period is another decision.
  EXPECT_TRUE(NewAlerts(t, Policy(), from_status, kNow + 86400).empty());  // no usage there yet
}

TEST(BudgetRecord, TheConfigMapRoundTripsAndSpendSaysWhatCameFromEachPod) {
  BudgetRecord r;
  r.totals.Fold("ns/a-r0-0", Reading("L1", {{Day("acme"), Usd(2.0, 3, 1)}}));
  r.totals.Fold("ns/b-r0-0", Reading("L2", {{Day("acme"), Usd(6.0, 7, 2)}}));
  r.alerts = NewAlerts(r.totals, Policy(), {}, kNow);  // 8.0 of 10: 50% and 80%
  ASSERT_EQ(r.alerts.size(), 2u);
  r.alerts[0].delivered_to = {"sre"};
  const nlohmann::json data = BudgetRecordData(r, "team-a", 4, kNow);
  auto back = ParseBudgetRecord(data);
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(back->totals, r.totals);
  ASSERT_EQ(back->alerts.size(), 2u);
  EXPECT_EQ(back->alerts[1].delivery_id, r.alerts[1].delivery_id);
  EXPECT_EQ(back->alerts[0].delivery_id, r.alerts[0].delivery_id);
  // The crossing survives the round trip: the body rebuilt from the record
  // read back is the body rebuilt before it was written, byte for byte.
  for (HookFormat f : {HookFormat::kJson, HookFormat::kSlack})
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(AlertBodyOf(back->alerts[i], "team-a", f), AlertBodyOf(r.alerts[i], "team-a", f));
  EXPECT_EQ(back->alerts[0].formats, r.alerts[0].formats);
  EXPECT_EQ(back->alerts[0].delivered_to, r.alerts[0].delivered_to);

  auto spend = ParseGlobalSpend(nlohmann::json::parse(data["spend.json"].get<std::string>()));
  ASSERT_TRUE(spend) << spend.error().ToString();
  EXPECT_EQ(spend->replicas, 4);
  ASSERT_EQ(spend->spend.size(), 1u);
  EXPECT_DOUBLE_EQ(spend->spend[0].spent_usd, 8.0);
  EXPECT_FALSE(spend->spend[0].counted_here_usd);  // the ConfigMap's copy serves every pod
  const GlobalSpend for_b = SpendFor(r.totals, "team-a", 4, kNow, "ns/b-r0-0");
  EXPECT_DOUBLE_EQ(*for_b.spend[0].counted_here_usd, 6.0);
  EXPECT_EQ(ParseGlobalSpend(GlobalSpendJson(for_b)).value(), for_b);

  const nlohmann::json usage = StatusUsage(r.totals);
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0]["tenant"], "acme");
  EXPECT_EQ(usage[0]["periodStart"], Iso8601Utc(kDay));
  EXPECT_DOUBLE_EQ(usage[0]["spentUSD"].get<double>(), 8.0);
  EXPECT_EQ(usage[0]["tokens"]["output"], 10);

  nlohmann::json broken = data;
  broken["totals.json"] = "{not json";
  EXPECT_FALSE(ParseBudgetRecord(broken));
  // An undelivered alert without the facts to rebuild its body from is refused, naming the entry.
  nlohmann::json alerts = nlohmann::json::parse(data["alerts.json"].get<std::string>());
  alerts[1].erase("crossing");
  nlohmann::json no_crossing = data;
  no_crossing["alerts.json"] = alerts.dump();
  auto refused = ParseBudgetRecord(no_crossing);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("alerts.json[1].crossing"), std::string::npos) << refused.error().message();
}

// A `block` budget's refusal reaches its 100% threshold (budget_rules.hpp):
// the daemon lists it in GET /v1/usage, and the operator fires 1.0 from it
// once, with the refused amount kept in the record for every retry's body.
TEST(BudgetRecord, ARefusalReportedByADaemonFiresTheHundredPercentThresholdOnce) {
  const nlohmann::json body = {
      {"object", "list"},
      {"ledger_id", "L1"},
      {"data", nlohmann::json::array({{{"tenant", "acme"}, {"tier", "low"}, {"period", "day"},
                                       {"period_start", Iso8601Utc(kDay)}, {"requests", 8},
                                       {"tokens", {{"input", 0}, {"cached_input", 0}, {"output", 8}, {"reasoning", 0}}},
                                       {"cost_usd", 8.0}}})},
      {"refusals", nlohmann::json::array({{{"tenant", "acme"}, {"period", "day"}, {"period_start", Iso8601Utc(kDay)},
                                           {"refused_usd", 5.0}, {"at", Iso8601Utc(kNow)}}})}};
  auto reading = ParseUsageReading(body);
  ASSERT_TRUE(reading) << reading.error().ToString();
  ASSERT_EQ(reading->refusals.size(), 1u);
  UsageTotals t;
  t.Fold("ns/a-r0-0", *reading);
  // Without the refusal, $8 of $10 reaches 50% and 80% only.
  EXPECT_EQ(NewAlerts(t, Policy(), {}, kNow).size(), 2u);
  auto fired = NewAlerts(t, Policy(), {}, kNow, reading->refusals);
  ASSERT_EQ(fired.size(), 3u);
  EXPECT_DOUBLE_EQ(fired[2].threshold, 1.0);
  ASSERT_TRUE(fired[2].refused_usd);
  EXPECT_DOUBLE_EQ(*fired[2].refused_usd, 5.0);
  EXPECT_FALSE(fired[0].refused_usd);
  const auto json_body = nlohmann::json::parse(AlertBodyOf(fired[2], "team-a", HookFormat::kJson));
  EXPECT_DOUBLE_EQ(json_body["refused_usd"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(json_body["spent_usd"].get<double>(), 8.0);
  EXPECT_FALSE(nlohmann::json::parse(AlertBodyOf(fired[0], "team-a", HookFormat::kJson)).contains("refused_usd"));
  EXPECT_NE(AlertBodyOf(fired[2], "team-a", HookFormat::kSlack).find("refused a request that could have cost up to $5.00"),
            std::string::npos);
  // The record keeps the refused amount: a retry posts the same bytes.
  BudgetRecord r;
  r.totals = t;
  r.alerts = fired;
  auto back = ParseBudgetRecord(BudgetRecordData(r, "team-a", 1, kNow));
  ASSERT_TRUE(back) << back.error().ToString();
  EXPECT_EQ(AlertBodyOf(back->alerts[2], "team-a", HookFormat::kJson), AlertBodyOf(fired[2], "team-a", HookFormat::kJson));
  // Reported again at every sync of the period: decided once.
  EXPECT_TRUE(NewAlerts(t, Policy(), fired, kNow, reading->refusals).empty());
  // An `alert` budget refuses nothing: a refusal listed for it fires nothing.
  BudgetPolicy alert_only = Policy();
  alert_only.budgets[0].action = BudgetAction::kAlert;
  EXPECT_EQ(NewAlerts(t, alert_only, {}, kNow, reading->refusals).size(), 2u);
  // A malformed refusal is refused, naming it.
  nlohmann::json bad = body;
  bad["refusals"][0]["refused_usd"] = "five";
  auto refused = ParseUsageReading(bad);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("usage.refusals[0].refused_usd"), std::string::npos) << refused.error().message();
}

}  // namespace
}  // namespace moeserve::op

#include "moeserve/operator/budget_record.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "moeserve/budget/budget_alert.hpp"
#include "moeserve/budget/budget_rules.hpp"

namespace moeserve::op {

namespace {

std::string NewDeliveryId() {
  unsigned char raw[16] = {};
  RAND_bytes(raw, sizeof raw);  // on failure the zeros still make an id; a collision only merges two alerts at a receiver
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "dlv_";
  for (unsigned char b : raw) id += {kHex[b >> 4], kHex[b & 15]};
  return id;
}

Result<nlohmann::json> ParseData(const nlohmann::json& data, const char* key, nlohmann::json empty) {
  if (!data.is_object() || !data.contains(key)) return empty;
  if (!data[key].is_string()) return Fail(Error::InvalidArgument(std::string(key) + ": not a string"));
  auto j = nlohmann::json::parse(data[key].get<std::string>(), nullptr, false);
  if (j.is_discarded()) return Fail(Error::InvalidArgument(std::string(key) + ": not JSON"));
  return j;
}

nlohmann::json TokensJson(const TokenCounts& t) {
  return {{"input", t.input}, {"cachedInput", t.cached_input}, {"output", t.output}, {"reasoning", t.reasoning}};
}

bool ParseTokens(const nlohmann::json& j, TokenCounts& t) {
  if (!j.is_object()) return false;
  for (auto [key, field] : {std::pair{"input", &t.input}, std::pair{"cachedInput", &t.cached_input},
                            std::pair{"output", &t.output}, std::pair{"reasoning", &t.reasoning}}) {
    const nlohmann::json v = j.value(key, nlohmann::json());
    if (!v.is_number_integer()) return false;
    *field = v.get<int64_t>();
  }
  return true;
}

nlohmann::json CrossingJson(const AlertRecord& a) {
  nlohmann::json by_tier = nlohmann::json::object();
  for (const auto& [tier, v] : a.spend.by_tier) by_tier[tier] = {{"tokens", TokensJson(v.first)}, {"costUSD", v.second}};
  nlohmann::json c = {{"spentUSD", a.spend.spent_usd},
                      {"tokens", TokensJson(a.spend.tokens)},
                      {"byTier", by_tier},
                      {"budgetUSD", a.budget_usd},
                      {"action", std::string(BudgetActionName(a.action))},
                      {"deployment", a.deployment},
                      {"formats", a.formats}};
  if (a.refused_usd) c["refusedUSD"] = *a.refused_usd;
  return c;
}

// The crossing of an undelivered alert; false when any field is missing or of the wrong type.
bool ParseCrossing(const nlohmann::json& c, AlertRecord& a) {
  if (!c.is_object()) return false;
  const nlohmann::json spent = c.value("spentUSD", nlohmann::json()), budget = c.value("budgetUSD", nlohmann::json());
  const nlohmann::json action = c.value("action", nlohmann::json()), deployment = c.value("deployment", nlohmann::json());
  const nlohmann::json formats = c.value("formats", nlohmann::json()), by_tier = c.value("byTier", nlohmann::json());
  if (!spent.is_number() || !budget.is_number() || !action.is_string() || !deployment.is_string() ||
      !formats.is_array() || !by_tier.is_object() || !ParseTokens(c.value("tokens", nlohmann::json()), a.spend.tokens))
    return false;
  a.spend.spent_usd = spent.get<double>();
  a.budget_usd = budget.get<double>();
  if (c.contains("refusedUSD")) {
    if (!c["refusedUSD"].is_number()) return false;
    a.refused_usd = c["refusedUSD"].get<double>();
  }
  bool known_action = false;
  for (BudgetAction candidate : {BudgetAction::kAlert, BudgetAction::kDowngrade, BudgetAction::kBlock})
    if (BudgetActionName(candidate) == action.get<std::string>()) a.action = candidate, known_action = true;
  if (!known_action) return false;
  a.deployment = deployment.get<std::string>();
  for (const auto& f : formats) {
    if (!f.is_string() || (f != "json" && f != "slack")) return false;
    a.formats.push_back(f.get<std::string>());
  }
  for (const auto& [tier, v] : by_tier.items()) {
    TokenCounts t;
    if (!v.is_object() || !ParseTokens(v.value("tokens", nlohmann::json()), t) || !v.value("costUSD", nlohmann::json()).is_number())
      return false;
    a.spend.by_tier[tier] = {t, v["costUSD"].get<double>()};
  }
  return true;
}

std::optional<AlertRecord> ParseAlert(const nlohmann::json& a) {
  if (!a.is_object()) return std::nullopt;
  AlertRecord r;
  auto str = [&](const char* k) { return a.value(k, nlohmann::json()).is_string() ? a[k].get<std::string>() : ""; };
  r.tenant = str("tenant");
  auto period = ParsePeriod(str("period"));
  auto start = ParseIso8601Utc(str("periodStart"));
  auto fired = ParseIso8601Utc(str("firedAt"));
  if (r.tenant.empty() || !period || !start || !a.value("threshold", nlohmann::json()).is_number()) return std::nullopt;
  r.period = *period;
  r.period_start = *start;
  r.threshold = a["threshold"].get<double>();
  r.fired_at = fired.value_or(0);
  r.delivery_id = str("deliveryId");
  r.delivered = a.value("delivered", nlohmann::json()) == nlohmann::json(true);
  return r;
}

// as_record: the record's form (what a post is rebuilt from); without: status.alerts.
nlohmann::json AlertJson(const AlertRecord& a, bool as_record) {
  nlohmann::json j = {{"tenant", a.tenant},
                      {"period", PeriodName(a.period)},
                      {"periodStart", Iso8601Utc(a.period_start)},
                      {"threshold", a.threshold},
                      {"firedAt", Iso8601Utc(a.fired_at)},
                      {"deliveryId", a.delivery_id},
                      {"delivered", a.delivered}};
  if (as_record) {
    if (a.abandoned) j["abandoned"] = true;
    if (!a.delivered && !a.abandoned) j["crossing"] = CrossingJson(a);
    if (!a.delivered_to.empty()) j["deliveredTo"] = a.delivered_to;
  }
  return j;
}

}  // namespace

std::string FormatName(HookFormat format) { return format == HookFormat::kSlack ? "slack" : "json"; }

std::string AlertBodyOf(const AlertRecord& a, const std::string& policy_name, HookFormat format) {
  Budget budget;
  budget.tenant = a.tenant;
  budget.period = a.period;
  budget.limit_usd = a.budget_usd;
  budget.action = a.action;
  BudgetPolicy policy;
  policy.policy_name = policy_name;
  policy.deployment_name = a.deployment;
  const ThresholdCrossing c{a.tenant, &budget, a.period_start, a.threshold, a.spend, a.fired_at, a.refused_usd};
  return AlertBody(c, policy, format);
}

bool SameAlert(const AlertRecord& a, const AlertRecord& b) {
  return a.tenant == b.tenant && a.period == b.period && a.period_start == b.period_start &&
         std::abs(a.threshold - b.threshold) < 1e-9;
}

Result<BudgetRecord> ParseBudgetRecord(const nlohmann::json& data) {
  BudgetRecord r;
  MOE_ASSIGN_OR_RETURN(nlohmann::json totals, ParseData(data, "totals.json", nlohmann::json::object()));
  MOE_ASSIGN_OR_RETURN(r.totals, UsageTotals::FromJson(totals));
  MOE_ASSIGN_OR_RETURN(nlohmann::json alerts, ParseData(data, "alerts.json", nlohmann::json::array()));
  if (!alerts.is_array()) return Fail(Error::InvalidArgument("alerts.json: not a list"));
  for (size_t i = 0; i < alerts.size(); ++i) {
    const nlohmann::json& a = alerts[i];
    const std::string at = "alerts.json[" + std::to_string(i) + "]";
    auto parsed = ParseAlert(a);
    if (!parsed) return Fail(Error::InvalidArgument(at + ": lacks tenant, period, periodStart or threshold"));
    const nlohmann::json abandoned = a.value("abandoned", nlohmann::json(false));
    if (!abandoned.is_boolean()) return Fail(Error::InvalidArgument(at + ".abandoned: not a boolean"));
    parsed->abandoned = abandoned.get<bool>();
    if (!parsed->delivered && !parsed->abandoned && !ParseCrossing(a.value("crossing", nlohmann::json()), *parsed))
      return Fail(Error::InvalidArgument(at + ".crossing: missing or malformed (an undelivered alert is posted from it)"));
    const nlohmann::json delivered_to = a.value("deliveredTo", nlohmann::json::array());
    if (!delivered_to.is_array()) return Fail(Error::InvalidArgument(at + ".deliveredTo: not a list"));
    for (const auto& h : delivered_to) {
      if (!h.is_string()) return Fail(Error::InvalidArgument(at + ".deliveredTo: not a list of strings"));
      parsed->delivered_to.push_back(h.get<std::string>());
    }
    r.alerts.push_back(std::move(*parsed));
  }
  return r;
}

nlohmann::json BudgetRecordData(const BudgetRecord& record, const std::string& policy, int64_t replicas, int64_t now) {
  nlohmann::json alerts = nlohmann::json::array();
  for (const auto& a : record.alerts) alerts.push_back(AlertJson(a, true));
  auto dump = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  return {{"totals.json", dump(record.totals.ToJson())},
          {"alerts.json", dump(alerts)},
          {"spend.json", dump(GlobalSpendJson(SpendFor(record.totals, policy, replicas, now, std::nullopt)))}};
}

nlohmann::json StatusUsage(const UsageTotals& totals) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [tenant, period, start] : totals.Periods()) {
    const PeriodSpend s = totals.Spend(tenant, period, start);
    out.push_back({{"tenant", tenant},
                   {"period", PeriodName(period)},
                   {"periodStart", Iso8601Utc(start)},
                   {"spentUSD", s.spent_usd},
                   {"tokens",
                    {{"input", s.tokens.input},
                     {"cachedInput", s.tokens.cached_input},
                     {"output", s.tokens.output},
                     {"reasoning", s.tokens.reasoning}}}});
  }
  return out;
}

nlohmann::json StatusAlerts(const std::vector<AlertRecord>& alerts) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : alerts) out.push_back(AlertJson(a, false));
  return out;
}

std::vector<AlertRecord> ParseStatusAlerts(const nlohmann::json& alerts) {
  std::vector<AlertRecord> out;
  if (!alerts.is_array()) return out;
  for (const auto& a : alerts)
    if (auto r = ParseAlert(a)) out.push_back(std::move(*r));
  return out;
}

std::vector<AlertRecord> NewAlerts(const UsageTotals& totals, const BudgetPolicy& policy,
                                   const std::vector<AlertRecord>& known, int64_t now, const RefusalMap& refusals) {
  std::set<HookFormat> formats;
  for (const auto& h : policy.hooks) formats.insert(h.format);
  std::vector<AlertRecord> out;
  std::set<std::tuple<std::string, BudgetPeriod, int64_t>> periods;
  for (const auto& p : totals.Periods()) periods.insert(p);
  for (const auto& [key, usd] : refusals) periods.insert(key);  // a refusal may come before any charge is read
  for (const auto& [tenant, period, start] : periods) {
    if (start != PeriodStart(period, now)) continue;
    const PeriodSpend spend = totals.Spend(tenant, period, start);
    const auto refusal = refusals.find({tenant, period, start});
    for (const Budget* b : policy.BudgetsFor(tenant)) {
      if (b->period != period) continue;
      auto already_fired = [&](double threshold) {
        AlertRecord probe;
        probe.tenant = tenant;
        probe.period = period;
        probe.period_start = start;
        probe.threshold = threshold;
        auto same = [&](const AlertRecord& k) { return SameAlert(k, probe); };
        return std::any_of(known.begin(), known.end(), same) || std::any_of(out.begin(), out.end(), same);
      };
      for (const auto& [threshold, by_refusal] :
           ThresholdsToFire(*b, spend.spent_usd, refusal != refusals.end(), already_fired)) {
        AlertRecord a;
        a.tenant = tenant;
        a.period = period;
        a.period_start = start;
        a.threshold = threshold;
        a.fired_at = now;
        a.delivery_id = NewDeliveryId();
        a.spend = spend;
        a.budget_usd = b->limit_usd;
        a.action = b->action;
        if (by_refusal) a.refused_usd = refusal->second;
        a.deployment = policy.deployment_name;
        for (HookFormat f : formats) a.formats.push_back(FormatName(f));
        if (formats.empty()) a.delivered = true;  // no hook to tell: recorded, nothing to send
        out.push_back(std::move(a));
      }
    }
  }
  return out;
}

GlobalSpend SpendFor(const UsageTotals& totals, const std::string& policy, int64_t replicas, int64_t now,
                     const std::optional<std::string>& pod) {
  GlobalSpend g;
  g.policy = policy;
  g.replicas = std::max<int64_t>(1, replicas);
  g.synced_at = now;
  for (const auto& [tenant, period, start] : totals.Periods()) {
    GlobalSpendEntry e{tenant, period, start, totals.Spend(tenant, period, start).spent_usd, std::nullopt};
    if (pod) e.counted_here_usd = totals.CountedFrom(*pod, tenant, period, start);
    g.spend.push_back(std::move(e));
  }
  return g;
}

}  // namespace moeserve::op

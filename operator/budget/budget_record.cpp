#include "moeserve/operator/budget_record.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "moeserve/common/budget_alert.hpp"

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

nlohmann::json AlertJson(const AlertRecord& a, bool with_bodies) {
  nlohmann::json j = {{"tenant", a.tenant},
                      {"period", PeriodName(a.period)},
                      {"periodStart", Iso8601Utc(a.period_start)},
                      {"threshold", a.threshold},
                      {"firedAt", Iso8601Utc(a.fired_at)},
                      {"deliveryId", a.delivery_id},
                      {"delivered", a.delivered}};
  if (with_bodies) {
    if (a.abandoned) j["abandoned"] = true;
    if (!a.bodies.empty()) j["bodies"] = a.bodies;
    if (!a.delivered_to.empty()) j["deliveredTo"] = a.delivered_to;
  }
  return j;
}

}  // namespace

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
  for (const auto& a : alerts) {
    auto parsed = ParseAlert(a);
    if (!parsed) return Fail(Error::InvalidArgument("alerts.json: an entry lacks tenant, period, periodStart or threshold"));
    parsed->abandoned = a.value("abandoned", false);
    if (a.contains("bodies") && a["bodies"].is_object())
      for (const auto& [format, body] : a["bodies"].items())
        if (body.is_string()) parsed->bodies[format] = body.get<std::string>();
    if (a.contains("deliveredTo") && a["deliveredTo"].is_array())
      for (const auto& h : a["deliveredTo"])
        if (h.is_string()) parsed->delivered_to.push_back(h.get<std::string>());
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
                                   const std::vector<AlertRecord>& known, int64_t now) {
  std::set<HookFormat> formats;
  for (const auto& h : policy.hooks) formats.insert(h.format);
  std::vector<AlertRecord> out;
  for (const auto& [tenant, period, start] : totals.Periods()) {
    if (start != PeriodStart(period, now)) continue;
    const PeriodSpend spend = totals.Spend(tenant, period, start);
    for (const Budget* b : policy.BudgetsFor(tenant)) {
      if (b->period != period) continue;
      for (double threshold : b->thresholds) {
        // As the daemon's ledger decides (usage_ledger.cpp), with room for the float sum.
        if (spend.spent_usd < threshold * b->limit_usd - 1e-9) continue;
        AlertRecord a;
        a.tenant = tenant;
        a.period = period;
        a.period_start = start;
        a.threshold = threshold;
        auto same = [&](const AlertRecord& k) { return SameAlert(k, a); };
        if (std::any_of(known.begin(), known.end(), same) || std::any_of(out.begin(), out.end(), same)) continue;
        a.fired_at = now;
        a.delivery_id = NewDeliveryId();
        ThresholdCrossing c{tenant, b, start, threshold, spend, now};
        for (HookFormat f : formats) a.bodies[f == HookFormat::kSlack ? "slack" : "json"] = AlertBody(c, policy, f);
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

#include "moeserve/operator/usage_totals.hpp"

#include <cmath>
#include <set>

namespace moeserve::op {

namespace {

constexpr size_t kMaxRows = 200000;

bool AnyBelow(const UsageAmount& now, const UsageAmount& last) {
  // A float sum read back may differ in its last bits: a cent's millionth is no reset.
  return now.cost_usd < last.cost_usd - 1e-9 || now.requests < last.requests ||
         now.tokens.input < last.tokens.input || now.tokens.cached_input < last.tokens.cached_input ||
         now.tokens.output < last.tokens.output || now.tokens.reasoning < last.tokens.reasoning;
}

nlohmann::json TokensJson(const TokenCounts& t) {
  return {{"input", t.input}, {"cached_input", t.cached_input}, {"output", t.output}, {"reasoning", t.reasoning}};
}

Result<int64_t> Count(const nlohmann::json& o, const char* key, const std::string& where) {
  if (!o.is_object() || !o.contains(key) || !o[key].is_number_integer() || o[key].get<int64_t>() < 0)
    return Fail(Error::InvalidArgument(where + "." + key + ": must be an integer >= 0"));
  return o[key].get<int64_t>();
}

// One row as GET /v1/usage writes it (and as the ConfigMap keeps it).
Result<std::pair<UsageKey, UsageAmount>> ParseRow(const nlohmann::json& r, const std::string& where) {
  if (!r.is_object()) return Fail(Error::InvalidArgument(where + ": must be an object"));
  auto text = [&](const char* key) -> Result<std::string> {
    if (!r.contains(key) || !r[key].is_string() || r[key].get<std::string>().empty())
      return Fail(Error::InvalidArgument(where + "." + key + ": must be a non-empty string"));
    return r[key].get<std::string>();
  };
  MOE_ASSIGN_OR_RETURN(std::string tenant, text("tenant"));
  MOE_ASSIGN_OR_RETURN(std::string tier, text("tier"));
  MOE_ASSIGN_OR_RETURN(std::string period_name, text("period"));
  MOE_ASSIGN_OR_RETURN(std::string start_text, text("period_start"));
  auto period = ParsePeriod(period_name);
  if (!period) return Fail(Error::InvalidArgument(where + ".period: must be day or month"));
  auto start = ParseIso8601Utc(start_text);
  if (!start || PeriodStart(*period, *start) != *start)
    return Fail(Error::InvalidArgument(where + ".period_start: must be the UTC start of a " + period_name));
  UsageAmount a;
  const nlohmann::json tokens = r.value("tokens", nlohmann::json());
  MOE_ASSIGN_OR_RETURN(a.tokens.input, Count(tokens, "input", where + ".tokens"));
  MOE_ASSIGN_OR_RETURN(a.tokens.cached_input, Count(tokens, "cached_input", where + ".tokens"));
  MOE_ASSIGN_OR_RETURN(a.tokens.output, Count(tokens, "output", where + ".tokens"));
  MOE_ASSIGN_OR_RETURN(a.tokens.reasoning, Count(tokens, "reasoning", where + ".tokens"));
  if (r.contains("requests")) {
    MOE_ASSIGN_OR_RETURN(a.requests, Count(r, "requests", where));
  }
  if (!r.contains("cost_usd") || !r["cost_usd"].is_number() || !std::isfinite(r["cost_usd"].get<double>()) ||
      r["cost_usd"].get<double>() < 0)
    return Fail(Error::InvalidArgument(where + ".cost_usd: must be a number >= 0"));
  a.cost_usd = r["cost_usd"].get<double>();
  return std::pair{UsageKey{tenant, tier, *period, *start}, a};
}

nlohmann::json RowJson(const UsageKey& k, const UsageAmount& a) {
  const auto& [tenant, tier, period, start] = k;
  return {{"tenant", tenant},       {"tier", tier},           {"period", PeriodName(period)},
          {"period_start", Iso8601Utc(start)}, {"requests", a.requests}, {"tokens", TokensJson(a.tokens)},
          {"cost_usd", a.cost_usd}};
}

Result<UsageRows> ParseRows(const nlohmann::json& list, const std::string& where) {
  if (!list.is_array()) return Fail(Error::InvalidArgument(where + ": must be a list"));
  if (list.size() > kMaxRows) return Fail(Error::InvalidArgument(where + ": more than " + std::to_string(kMaxRows) + " rows"));
  UsageRows rows;
  size_t i = 0;
  for (const auto& r : list) {
    MOE_ASSIGN_OR_RETURN(auto row, ParseRow(r, where + "[" + std::to_string(i++) + "]"));
    rows[row.first] += row.second;
  }
  return rows;
}

// Last reads are most of the ConfigMap (pods x tenants x tiers x periods
// rows; a ConfigMap holds at most 1 MiB): one short array per row,
// [tenant, tier, period, start, requests, input, cached_input, output, reasoning, cost_usd].
nlohmann::json CompactRowsJson(const UsageRows& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [k, a] : rows) {
    const auto& [tenant, tier, period, start] = k;
    out.push_back({tenant, tier, PeriodName(period), start, a.requests, a.tokens.input, a.tokens.cached_input,
                   a.tokens.output, a.tokens.reasoning, a.cost_usd});
  }
  return out;
}

Result<UsageRows> ParseCompactRows(const nlohmann::json& list, const std::string& where) {
  if (!list.is_array()) return Fail(Error::InvalidArgument(where + ": must be a list"));
  if (list.size() > kMaxRows) return Fail(Error::InvalidArgument(where + ": more than " + std::to_string(kMaxRows) + " rows"));
  UsageRows rows;
  size_t i = 0;
  for (const auto& r : list) {
    const std::string at = where + "[" + std::to_string(i++) + "]";
    if (!r.is_array() || r.size() != 10 || !r[0].is_string() || !r[1].is_string() || !r[2].is_string() ||
        !r[3].is_number_integer() || !r[9].is_number())
      return Fail(Error::InvalidArgument(at + ": must be [tenant, tier, period, start, requests, input, cached_input, "
                                              "output, reasoning, cost_usd]"));
    auto period = ParsePeriod(r[2].get<std::string>());
    if (!period) return Fail(Error::InvalidArgument(at + ": period must be day or month"));
    UsageAmount a;
    int64_t* counts[] = {&a.requests, &a.tokens.input, &a.tokens.cached_input, &a.tokens.output, &a.tokens.reasoning};
    for (int j = 0; j < 5; ++j) {
      if (!r[4 + j].is_number_integer() || r[4 + j].get<int64_t>() < 0)
        return Fail(Error::InvalidArgument(at + ": counts must be integers >= 0"));
      *counts[j] = r[4 + j].get<int64_t>();
    }
    a.cost_usd = r[9].get<double>();
    rows[{r[0].get<std::string>(), r[1].get<std::string>(), *period, r[3].get<int64_t>()}] += a;
  }
  return rows;
}

// "refusals" of GET /v1/usage: [{tenant, period, period_start, refused_usd, at}]
// (absent from a daemon older than the rule: none).
Result<RefusalMap> ParseRefusals(const nlohmann::json& list, const std::string& where) {
  RefusalMap out;
  if (list.is_null()) return out;
  if (!list.is_array()) return Fail(Error::InvalidArgument(where + ": must be a list"));
  if (list.size() > kMaxRows) return Fail(Error::InvalidArgument(where + ": more than " + std::to_string(kMaxRows) + " rows"));
  size_t i = 0;
  for (const auto& r : list) {
    const std::string at = where + "[" + std::to_string(i++) + "]";
    if (!r.is_object()) return Fail(Error::InvalidArgument(at + ": must be an object"));
    const nlohmann::json tenant = r.value("tenant", nlohmann::json()), usd = r.value("refused_usd", nlohmann::json());
    if (!tenant.is_string() || tenant.get<std::string>().empty())
      return Fail(Error::InvalidArgument(at + ".tenant: must be a non-empty string"));
    auto period = ParsePeriod(r.value("period", nlohmann::json()).is_string() ? r["period"].get<std::string>() : "");
    if (!period) return Fail(Error::InvalidArgument(at + ".period: must be day or month"));
    auto start = ParseIso8601Utc(r.value("period_start", nlohmann::json()).is_string() ? r["period_start"].get<std::string>() : "");
    if (!start || PeriodStart(*period, *start) != *start)
      return Fail(Error::InvalidArgument(at + ".period_start: must be the UTC start of a " + std::string(PeriodName(*period))));
    if (!usd.is_number() || !std::isfinite(usd.get<double>()) || usd.get<double>() < 0)
      return Fail(Error::InvalidArgument(at + ".refused_usd: must be a number >= 0"));
    out.emplace(std::tuple{tenant.get<std::string>(), *period, *start}, usd.get<double>());
  }
  return out;
}

nlohmann::json RowsJson(const UsageRows& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [k, a] : rows) out.push_back(RowJson(k, a));
  return out;
}

}  // namespace

UsageAmount Growth(const UsageAmount& last, const UsageAmount& now, bool same_ledger) {
  if (!same_ledger || AnyBelow(now, last)) return now;
  UsageAmount d;
  d.tokens = {now.tokens.input - last.tokens.input, now.tokens.cached_input - last.tokens.cached_input,
              now.tokens.output - last.tokens.output, now.tokens.reasoning - last.tokens.reasoning};
  d.requests = now.requests - last.requests;
  d.cost_usd = std::max(0.0, now.cost_usd - last.cost_usd);
  return d;
}

Result<UsageReading> ParseUsageReading(const nlohmann::json& body) {
  if (!body.is_object()) return Fail(Error::InvalidArgument("usage: not a JSON object"));
  UsageReading r;
  if (!body.contains("ledger_id") || !body["ledger_id"].is_string() || body["ledger_id"].get<std::string>().empty())
    return Fail(Error::InvalidArgument("usage.ledger_id: must be a non-empty string (a daemon older than the usage sync?)"));
  r.ledger_id = body["ledger_id"].get<std::string>();
  MOE_ASSIGN_OR_RETURN(r.rows, ParseRows(body.value("data", nlohmann::json()), "usage.data"));
  MOE_ASSIGN_OR_RETURN(r.refusals, ParseRefusals(body.value("refusals", nlohmann::json()), "usage.refusals"));
  return r;
}

void UsageTotals::Fold(const std::string& pod, const UsageReading& reading) {
  auto it = pods.find(pod);
  const bool known = it != pods.end();
  const bool same_ledger = known && it->second.ledger_id == reading.ledger_id;
  for (const auto& [key, now] : reading.rows) {
    UsageAmount last;
    if (same_ledger) {
      auto l = it->second.rows.find(key);
      if (l != it->second.rows.end()) last = l->second;
    }
    sum[key] += Growth(last, now, same_ledger);
  }
  pods[pod] = {reading.ledger_id, reading.rows};
}

void UsageTotals::Prune(int64_t now) {
  auto current = [now](const UsageKey& k) { return std::get<3>(k) == PeriodStart(std::get<2>(k), now); };
  std::erase_if(sum, [&](const auto& kv) { return !current(kv.first); });
  for (auto& [pod, seen] : pods) std::erase_if(seen.rows, [&](const auto& kv) { return !current(kv.first); });
}

double UsageTotals::CountedFrom(const std::string& pod, const std::string& tenant, BudgetPeriod period,
                                int64_t start) const {
  auto it = pods.find(pod);
  if (it == pods.end()) return 0;
  double usd = 0;
  for (const auto& [k, a] : it->second.rows)
    if (std::get<0>(k) == tenant && std::get<2>(k) == period && std::get<3>(k) == start) usd += a.cost_usd;
  return usd;
}

PeriodSpend UsageTotals::Spend(const std::string& tenant, BudgetPeriod period, int64_t start) const {
  PeriodSpend s;
  for (const auto& [k, a] : sum) {
    if (std::get<0>(k) != tenant || std::get<2>(k) != period || std::get<3>(k) != start) continue;
    s.spent_usd += a.cost_usd;
    s.tokens += a.tokens;
    auto& tier = s.by_tier[std::get<1>(k)];
    tier.first += a.tokens;
    tier.second += a.cost_usd;
  }
  return s;
}

std::vector<std::tuple<std::string, BudgetPeriod, int64_t>> UsageTotals::Periods() const {
  std::set<std::tuple<std::string, BudgetPeriod, int64_t>> out;
  for (const auto& [k, a] : sum) out.insert({std::get<0>(k), std::get<2>(k), std::get<3>(k)});
  return {out.begin(), out.end()};
}

nlohmann::json UsageTotals::ToJson() const {
  nlohmann::json p = nlohmann::json::object();
  for (const auto& [pod, seen] : pods) p[pod] = {{"ledger_id", seen.ledger_id}, {"rows", CompactRowsJson(seen.rows)}};
  return {{"sum", RowsJson(sum)}, {"pods", std::move(p)}};
}

Result<UsageTotals> UsageTotals::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Fail(Error::InvalidArgument("totals: not a JSON object"));
  UsageTotals t;
  MOE_ASSIGN_OR_RETURN(t.sum, ParseRows(j.value("sum", nlohmann::json::array()), "totals.sum"));
  const nlohmann::json pods = j.value("pods", nlohmann::json::object());
  if (!pods.is_object()) return Fail(Error::InvalidArgument("totals.pods: must be an object"));
  for (const auto& [pod, seen] : pods.items()) {
    const std::string where = "totals.pods[" + pod + "]";
    if (!seen.is_object() || !seen.value("ledger_id", nlohmann::json()).is_string())
      return Fail(Error::InvalidArgument(where + ".ledger_id: must be a string"));
    PodLastSeen s;
    s.ledger_id = seen["ledger_id"].get<std::string>();
    MOE_ASSIGN_OR_RETURN(s.rows, ParseCompactRows(seen.value("rows", nlohmann::json::array()), where + ".rows"));
    t.pods[pod] = std::move(s);
  }
  return t;
}

}  // namespace moeserve::op

#include "moeserve/budget/global_spend.hpp"

#include <cmath>

namespace moeserve {

namespace {
constexpr size_t kMaxEntries = 100000;

Error Bad(const std::string& field, const std::string& what) { return Error::InvalidArgument(field + ": " + what); }

bool FiniteNonNegative(const nlohmann::json& v) {
  return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 && v.get<double>() < 1e15;
}
}  // namespace

nlohmann::json GlobalSpendJson(const GlobalSpend& s) {
  nlohmann::json spend = nlohmann::json::array();
  for (const auto& e : s.spend) {
    nlohmann::json j = {{"tenant", e.tenant},
                        {"period", PeriodName(e.period)},
                        {"period_start", Iso8601Utc(e.period_start)},
                        {"spent_usd", e.spent_usd}};
    if (e.counted_here_usd) j["counted_here_usd"] = *e.counted_here_usd;
    spend.push_back(std::move(j));
  }
  return {{"policy", s.policy}, {"replicas", s.replicas}, {"synced_at", Iso8601Utc(s.synced_at)}, {"spend", std::move(spend)}};
}

Result<GlobalSpend> ParseGlobalSpend(const nlohmann::json& j) {
  if (!j.is_object()) return Fail(Error::InvalidArgument("the body must be a JSON object {policy, replicas, spend}"));
  GlobalSpend out;
  if (!j.contains("policy") || !j["policy"].is_string() || j["policy"].get<std::string>().empty())
    return Fail(Bad("policy", "must be a non-empty string"));
  out.policy = j["policy"].get<std::string>();
  if (j.contains("replicas")) {
    if (!j["replicas"].is_number_integer() || j["replicas"].get<int64_t>() < 1 || j["replicas"].get<int64_t>() > 1000000)
      return Fail(Bad("replicas", "must be an integer from 1 to 1000000"));
    out.replicas = j["replicas"].get<int64_t>();
  }
  if (j.contains("synced_at")) {
    auto at = j["synced_at"].is_string() ? ParseIso8601Utc(j["synced_at"].get<std::string>()) : std::nullopt;
    if (!at) return Fail(Bad("synced_at", "must be a UTC time such as 2026-12-04T10:00:30Z"));
    out.synced_at = *at;
  }
  if (!j.contains("spend") || !j["spend"].is_array()) return Fail(Bad("spend", "must be a list"));
  if (j["spend"].size() > kMaxEntries)
    return Fail(Bad("spend", "has more than " + std::to_string(kMaxEntries) + " entries"));
  size_t i = 0;
  for (const auto& e : j["spend"]) {
    const std::string where = "spend[" + std::to_string(i++) + "]";
    if (!e.is_object()) return Fail(Bad(where, "must be an object {tenant, period, period_start, spent_usd}"));
    GlobalSpendEntry g;
    if (!e.contains("tenant") || !e["tenant"].is_string() || e["tenant"].get<std::string>().empty())
      return Fail(Bad(where + ".tenant", "must be a non-empty string"));
    g.tenant = e["tenant"].get<std::string>();
    auto period = e.contains("period") && e["period"].is_string() ? ParsePeriod(e["period"].get<std::string>()) : std::nullopt;
    if (!period) return Fail(Bad(where + ".period", "must be day or month"));
    g.period = *period;
    auto start = e.contains("period_start") && e["period_start"].is_string()
                     ? ParseIso8601Utc(e["period_start"].get<std::string>())
                     : std::nullopt;
    if (!start || PeriodStart(g.period, *start) != *start)
      return Fail(Bad(where + ".period_start", "must be the UTC start of a " + std::string(PeriodName(g.period))));
    g.period_start = *start;
    if (!e.contains("spent_usd") || !FiniteNonNegative(e["spent_usd"]))
      return Fail(Bad(where + ".spent_usd", "must be a number >= 0"));
    g.spent_usd = e["spent_usd"].get<double>();
    if (e.contains("counted_here_usd")) {
      if (!FiniteNonNegative(e["counted_here_usd"])) return Fail(Bad(where + ".counted_here_usd", "must be a number >= 0"));
      g.counted_here_usd = e["counted_here_usd"].get<double>();
    }
    out.spend.push_back(std::move(g));
  }
  return out;
}

}  // namespace moeserve

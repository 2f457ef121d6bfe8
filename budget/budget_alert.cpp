#include "moeserve/budget/budget_alert.hpp"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace moeserve {

namespace {
nlohmann::json TokensJson(const TokenCounts& t) {
  return {{"input", t.input}, {"cached_input", t.cached_input}, {"output", t.output}, {"reasoning", t.reasoning}};
}
// Cents are what people read; the JSON keeps full precision.
std::string Usd(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "$%.2f", v);
  return buf;
}
}  // namespace

std::string AlertBody(const ThresholdCrossing& c, const BudgetPolicy& policy, HookFormat format) {
  const std::string period(PeriodName(c.budget->period));
  if (format == HookFormat::kSlack) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%g%%", std::round(c.threshold * 1000) / 10);
    std::string text = "moeserve budget alert: tenant " + c.tenant + " has spent " + Usd(c.spend.spent_usd) + " of its " +
                       std::string(PeriodAdjective(c.budget->period)) + " budget of " + Usd(c.budget->limit_usd) + " (threshold " + pct + ", period from " +
                       Iso8601Utc(c.period_start) + "; policy " + policy.policy_name + ", deployment " +
                       policy.deployment_name + ", action " + std::string(BudgetActionName(c.budget->action)) + ")";
    if (c.refused_usd)
      text += "; the budget refused a request that could have cost up to " + Usd(*c.refused_usd);
    return nlohmann::json{{"text", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  nlohmann::json by_tier = nlohmann::json::object();
  for (const auto& [tier, v] : c.spend.by_tier) by_tier[tier] = {{"tokens", TokensJson(v.first)}, {"cost_usd", v.second}};
  nlohmann::json body = {{"type", "budget.threshold"},
                         {"tenant", c.tenant},
                         {"policy", policy.policy_name},
                         {"deployment", policy.deployment_name},
                         {"period", period},
                         {"period_start", Iso8601Utc(c.period_start)},
                         {"threshold", c.threshold},
                         {"spent_usd", c.spend.spent_usd},
                         {"budget_usd", c.budget->limit_usd},
                         {"tokens", TokensJson(c.spend.tokens)},
                         {"by_tier", std::move(by_tier)},
                         {"at", Iso8601Utc(c.at)}};
  if (c.refused_usd) body["refused_usd"] = *c.refused_usd;
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace moeserve

// The budget sections (`pricing`, `budgets`, `hooks`) of a QuotaPolicy's
// spec, as the API server hands it over in JSON, read by the one budget
// parser that also reads a daemon's YAML config (ParseBudgetSection): JSON is
// YAML, so each section becomes a YAML node and the same rules, defaults and
// messages apply to both. moe-operator (which fires the policy's alerts) and
// moectl (which shows its budgets) both read a QuotaPolicy through this.
//
// Thread safety: a pure function.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/budget/budget_policy.hpp"
#include "moeserve/common/status.hpp"

namespace moeserve {

// `spec`: a QuotaPolicy's spec (an absent or null section, or a spec that is
// not an object, leaves that part empty; other fields are not looked at). `where` prefixes every message, e.g.
// "QuotaPolicy team-a/limits spec". The result's policy_name is left as
// BudgetPolicy's default: the caller names it.
Result<BudgetPolicy> ParseQuotaPolicyBudget(const nlohmann::json& spec, const std::string& where);

}  // namespace moeserve

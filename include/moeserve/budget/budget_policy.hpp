// What a standalone daemon charges and enforces, read from the `pricing`,
// `budgets` and `hooks` sections of its --config file (the same shape as a
// QuotaPolicy's spec, docs/crds.md), plus the names that alert payloads carry:
//
//   policy_name: team-a              # "policy" in alert payloads (default "standalone")
//   deployment_name: ultra           # "deployment" (default: served_model_name)
//   pricing:                         # USD per million tokens, per tier and kind
//     low:    {input: 0.20, cachedInput: 0.02, output: 0.80, reasoning: 0.80}
//     medium: {input: 0.40, cachedInput: 0.04, output: 1.60, reasoning: 1.60}
//   budgets:
//     - {tenant: "*", period: month, limitUSD: 5000}               # thresholds kDefaultThresholds, action alert
//     - {tenant: batch, period: day, limitUSD: 100, action: downgrade,
//        thresholds: [0.9, 1.0], requestsPerMinute: 600, tokensPerMinute: 2000000}
//   hooks:
//     - {name: sre, url: https://alerts.internal/moe, secretFile: /etc/moe/hook-secret,
//        format: json, allowHTTP: false, allowPrivateAddresses: false}
//
// moe-operator reads the same sections from a QuotaPolicy's spec, where a
// hook names its secret as `secret: {secretRef: {name}}` or
// `secret: {vault: {path}}` instead of secretFile (exactly one of the two).
//
// A tier without a price costs nothing. A tenant with budget entries of its
// own follows only those; every other tenant follows the "*" entries. Hook
// secrets are read from their files at start and never logged.
//
// Thread safety: plain values, immutable once the daemon starts.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "moeserve/common/status.hpp"
#include "moeserve/budget/budget_rules.hpp"
#include "moeserve/budget/usage_period.hpp"

namespace moeserve {

// Tokens of the four kinds, which never overlap: input + cached_input =
// prompt tokens, output + reasoning = completion tokens.
struct TokenCounts {
  int64_t input = 0, cached_input = 0, output = 0, reasoning = 0;
  TokenCounts& operator+=(const TokenCounts& o) {
    input += o.input, cached_input += o.cached_input, output += o.output, reasoning += o.reasoning;
    return *this;
  }
  int64_t total() const { return input + cached_input + output + reasoning; }
  bool operator==(const TokenCounts&) const = default;
};

// A tenant's spend in one period, over all tiers.
struct PeriodSpend {
  double spent_usd = 0;
  TokenCounts tokens;
  std::map<std::string, std::pair<TokenCounts, double>> by_tier;  // tier -> tokens, USD
};

// USD per million tokens of each kind.
struct TierPrices {
  double input = 0, cached_input = 0, output = 0, reasoning = 0;
  double Cost(const TokenCounts& t) const {
    return (t.input * input + t.cached_input * cached_input + t.output * output + t.reasoning * reasoning) / 1e6;
  }
};

enum class BudgetAction { kAlert, kDowngrade, kBlock };

struct Budget {
  std::string tenant;  // or "*"
  BudgetPeriod period = BudgetPeriod::kMonth;
  double limit_usd = 0;
  std::vector<double> thresholds{kDefaultThresholds.begin(), kDefaultThresholds.end()};  // ascending, in (0, 1]
  BudgetAction action = BudgetAction::kAlert;
  int64_t requests_per_minute = 0;  // 0: no limit
  int64_t tokens_per_minute = 0;
};

enum class HookFormat { kJson, kSlack };

struct HookConfig {
  std::string name;
  std::string url;
  std::string secret_file;  // a daemon's config: the file holding the secret
  std::string secret;       // read from secret_file at start, or by the operator; never logged
  HookFormat format = HookFormat::kJson;
  bool allow_http = false;
  bool allow_private_addresses = false;  // loopback, link-local (metadata), private ranges
  std::string secret_name;        // a QuotaPolicy's secret.secretRef.name (the operator reads it)
  std::string secret_vault_path;  // or its secret.vault.path
};

struct BudgetPolicy {
  std::string policy_name = "standalone";
  std::string deployment_name;
  std::map<std::string, TierPrices> pricing;  // tier -> prices
  std::vector<Budget> budgets;
  std::vector<HookConfig> hooks;

  double Cost(const std::string& tier, const TokenCounts& t) const;
  // The budgets tenant follows: its own entries, else the "*" ones.
  std::vector<const Budget*> BudgetsFor(const std::string& tenant) const;
};

std::string_view BudgetActionName(BudgetAction a);

// The fields each entry of a section may have (any other is refused).
inline constexpr std::array<std::string_view, 4> kPricingFields = {"input", "cachedInput", "output", "reasoning"};
inline constexpr std::array<std::string_view, 7> kBudgetFields = {
    "tenant", "period", "limitUSD", "thresholds", "action", "requestsPerMinute", "tokensPerMinute"};
// `secret` is a QuotaPolicy's; a daemon's config names `secretFile`.
inline constexpr std::array<std::string_view, 7> kHookFields = {"name",   "url",       "secretFile",          "secret",
                                                                "format", "allowHTTP", "allowPrivateAddresses"};

// One of the sections `pricing`, `budgets`, `hooks` of the daemon's YAML
// config, into `policy`; messages name `source` and the entry.
Status ParseBudgetSection(BudgetPolicy& policy, const std::string& key, const YAML::Node& node,
                          const std::string& source);
// Reads each hook's secretFile (fails naming the hook and file, never the content).
Status LoadHookSecrets(BudgetPolicy& policy);

}  // namespace moeserve

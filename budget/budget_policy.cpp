#include "moeserve/budget/budget_policy.hpp"

#include "moeserve/common/yaml_scalar.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <set>
#include <sstream>

namespace moeserve {

namespace {

Status Bad(const std::string& where, const std::string& what) {
  return Fail(Error::InvalidArgument(where + ": " + what));
}

Result<double> NonNegative(const YAML::Node& n, const std::string& where) {
  return yaml::Number(n, where, 0, 1e12);
}

Result<bool> Boolean(const YAML::Node& n, const std::string& where) { return yaml::Boolean(n, where); }

Result<std::string> Text(const YAML::Node& n, const std::string& where) { return yaml::Text(n, where); }

template <size_t N>
Status CheckKeys(const YAML::Node& n, const std::array<std::string_view, N>& allowed, const std::string& where) {
  if (!n.IsMap()) return Bad(where, "must be a map, not " + yaml::Describe(n));
  for (const auto& kv : n) {
    MOE_ASSIGN_OR_RETURN(const std::string k, yaml::Key(kv.first, where));
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) return Bad(where, "unknown field '" + k + "'");
  }
  return Ok();
}

constexpr std::array<std::string_view, 2> kHookSecretFields = {"secretRef", "vault"};
constexpr std::array<std::string_view, 1> kSecretRefFields = {"name"};
constexpr std::array<std::string_view, 1> kVaultFields = {"path"};

Status ParsePricing(BudgetPolicy& p, const YAML::Node& node, const std::string& source) {
  if (!node.IsMap()) return Bad(source + ": pricing", "must be a map of tier -> {input, cachedInput, output, reasoning}");
  for (const auto& kv : node) {
    MOE_ASSIGN_OR_RETURN(const std::string tier, yaml::Key(kv.first, source + ": pricing"));
    std::string where = source + ": pricing." + tier;
    if (tier != "low" && tier != "medium" && tier != "high") return Bad(where, "the tier must be low, medium or high");
    MOE_TRY(CheckKeys(kv.second, kPricingFields, where));
    TierPrices t;
    for (auto [key, slot] : {std::pair{"input", &t.input}, std::pair{"cachedInput", &t.cached_input},
                             std::pair{"output", &t.output}, std::pair{"reasoning", &t.reasoning}}) {
      if (kv.second[key]) {
        MOE_ASSIGN_OR_RETURN(*slot, NonNegative(kv.second[key], where + "." + key));
      }
    }
    p.pricing[tier] = t;
  }
  return Ok();
}

Status ParseBudgets(BudgetPolicy& p, const YAML::Node& node, const std::string& source) {
  if (!node.IsSequence()) return Bad(source + ": budgets", "must be a list of {tenant, period, limitUSD, ...}");
  std::set<std::pair<std::string, std::string>> seen;
  size_t i = 0;
  for (const auto& e : node) {
    std::string where = source + ": budgets[" + std::to_string(i++) + "]";
    MOE_TRY(CheckKeys(e, kBudgetFields, where));
    Budget b;
    if (!e["tenant"]) return Bad(where, "needs tenant (a name or \"*\")");
    MOE_ASSIGN_OR_RETURN(b.tenant, Text(e["tenant"], where + ".tenant"));
    if (!e["period"]) return Bad(where, "needs period (day or month)");
    MOE_ASSIGN_OR_RETURN(const std::string period_name, Text(e["period"], where + ".period"));
    auto period = ParsePeriod(period_name);
    if (!period) return Bad(where + ".period", "must be day or month");
    b.period = *period;
    if (!seen.emplace(b.tenant, std::string(PeriodName(b.period))).second) {
      return Bad(where, "a second budget for tenant '" + b.tenant + "' and period " + std::string(PeriodName(b.period)));
    }
    if (!e["limitUSD"]) return Bad(where, "needs limitUSD");
    MOE_ASSIGN_OR_RETURN(b.limit_usd, NonNegative(e["limitUSD"], where + ".limitUSD"));
    if (e["thresholds"]) {
      if (!e["thresholds"].IsSequence() || e["thresholds"].size() == 0) {
        return Bad(where + ".thresholds", "must be a non-empty list of fractions in (0, 1], not " +
                                              yaml::Describe(e["thresholds"]));
      }
      b.thresholds.clear();
      size_t t_index = 0;
      for (const auto& t : e["thresholds"]) {
        MOE_ASSIGN_OR_RETURN(double v, NonNegative(t, where + ".thresholds[" + std::to_string(t_index++) + "]"));
        if (v <= 0 || v > 1) return Bad(where + ".thresholds", "each must be in (0, 1]");
        b.thresholds.push_back(v);
      }
      std::sort(b.thresholds.begin(), b.thresholds.end());
      b.thresholds.erase(std::unique(b.thresholds.begin(), b.thresholds.end()), b.thresholds.end());
    }
    if (e["action"]) {
      MOE_ASSIGN_OR_RETURN(const std::string a, Text(e["action"], where + ".action"));
      if (a == "alert") b.action = BudgetAction::kAlert;
      else if (a == "downgrade") b.action = BudgetAction::kDowngrade;
      else if (a == "block") b.action = BudgetAction::kBlock;
      else return Bad(where + ".action", "must be alert, downgrade or block");
    }
    for (auto [key, slot] : {std::pair{"requestsPerMinute", &b.requests_per_minute},
                             std::pair{"tokensPerMinute", &b.tokens_per_minute}}) {
      if (!e[key]) continue;
      MOE_ASSIGN_OR_RETURN(*slot, yaml::Integer(e[key], where + "." + key, 0, INT64_MAX));
    }
    p.budgets.push_back(std::move(b));
  }
  return Ok();
}

Status ParseHooks(BudgetPolicy& p, const YAML::Node& node, const std::string& source) {
  if (!node.IsSequence()) return Bad(source + ": hooks", "must be a list of {name, url, secretFile, ...}");
  std::set<std::string> names;
  size_t i = 0;
  for (const auto& e : node) {
    std::string where = source + ": hooks[" + std::to_string(i++) + "]";
    MOE_TRY(CheckKeys(e, kHookFields, where));
    HookConfig h;
    if (!e["name"] || !e["url"] || (!e["secretFile"] == !e["secret"]))
      return Bad(where, "needs name, url and one of secretFile (a daemon's config) or secret (a QuotaPolicy's)");
    MOE_ASSIGN_OR_RETURN(h.name, Text(e["name"], where + ".name"));
    if (!names.insert(h.name).second) return Bad(where + ".name", "'" + h.name + "' is used twice");
    MOE_ASSIGN_OR_RETURN(h.url, Text(e["url"], where + ".url"));
    if (e["secretFile"]) {
      MOE_ASSIGN_OR_RETURN(h.secret_file, Text(e["secretFile"], where + ".secretFile"));
    } else {
      const YAML::Node ref = e["secret"];
      MOE_TRY(CheckKeys(ref, kHookSecretFields, where + ".secret"));
      if (ref["secretRef"] && !ref["vault"]) {
        MOE_TRY(CheckKeys(ref["secretRef"], kSecretRefFields, where + ".secret.secretRef"));
        MOE_ASSIGN_OR_RETURN(h.secret_name, Text(ref["secretRef"]["name"], where + ".secret.secretRef.name"));
      } else if (ref["vault"] && !ref["secretRef"]) {
        MOE_TRY(CheckKeys(ref["vault"], kVaultFields, where + ".secret.vault"));
        MOE_ASSIGN_OR_RETURN(h.secret_vault_path, Text(ref["vault"]["path"], where + ".secret.vault.path"));
      } else {
        return Bad(where + ".secret", "must hold exactly one of secretRef or vault");
      }
    }
    if (e["allowHTTP"]) {
      MOE_ASSIGN_OR_RETURN(h.allow_http, Boolean(e["allowHTTP"], where + ".allowHTTP"));
    }
    if (e["allowPrivateAddresses"]) {
      MOE_ASSIGN_OR_RETURN(h.allow_private_addresses, Boolean(e["allowPrivateAddresses"], where + ".allowPrivateAddresses"));
    }
    if (e["format"]) {
      MOE_ASSIGN_OR_RETURN(const std::string f, Text(e["format"], where + ".format"));
      if (f == "json") h.format = HookFormat::kJson;
      else if (f == "slack") h.format = HookFormat::kSlack;
      else return Bad(where + ".format", "must be json or slack");
    }
    const bool https = h.url.starts_with("https://"), http = h.url.starts_with("http://");
    if (!https && !(http && h.allow_http)) {
      return Bad(where + ".url", http ? "is http: set allowHTTP to post alerts in clear text" : "must be an https:// URL");
    }
    p.hooks.push_back(std::move(h));
  }
  return Ok();
}

}  // namespace

std::string_view BudgetActionName(BudgetAction a) {
  return a == BudgetAction::kAlert ? "alert" : a == BudgetAction::kDowngrade ? "downgrade" : "block";
}

double BudgetPolicy::Cost(const std::string& tier, const TokenCounts& t) const {
  auto it = pricing.find(tier);
  return it == pricing.end() ? 0.0 : it->second.Cost(t);
}

std::vector<const Budget*> BudgetPolicy::BudgetsFor(const std::string& tenant) const {
  std::vector<const Budget*> own, fallback;
  for (const auto& b : budgets) {
    if (b.tenant == tenant) own.push_back(&b);
    else if (b.tenant == "*") fallback.push_back(&b);
  }
  return own.empty() ? fallback : own;
}

Status ParseBudgetSection(BudgetPolicy& policy, const std::string& key, const YAML::Node& node,
                          const std::string& source) {
  try {
    if (key == "pricing") return ParsePricing(policy, node, source);
    if (key == "budgets") return ParseBudgets(policy, node, source);
    if (key == "hooks") return ParseHooks(policy, node, source);
  } catch (const YAML::Exception& e) {
    return Bad(source + ": " + key, e.what());
  }
  return Bad(source, "unknown section '" + key + "'");
}

Status LoadHookSecrets(BudgetPolicy& policy) {
  for (auto& h : policy.hooks) {
    if (h.secret_file.empty())
      return Fail(Error::InvalidArgument("hook '" + h.name + "': a daemon reads its secret from secretFile (secret is "
                                         "a QuotaPolicy's field, read by moe-operator)"));
    std::ifstream in(h.secret_file);
    if (!in) return Fail(Error::Io("hook '" + h.name + "': secretFile " + h.secret_file + " cannot be opened"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    if (s.size() < 16) {
      return Fail(Error::InvalidArgument("hook '" + h.name + "': the secret in " + h.secret_file +
                                         " must be at least 16 characters"));
    }
    h.secret = std::move(s);
  }
  return Ok();
}

}  // namespace moeserve

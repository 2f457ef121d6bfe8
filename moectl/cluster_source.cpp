#include "moeserve/moectl/cluster_source.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "moeserve/budget/quota_policy_budget.hpp"
#include "moeserve/operator/kube_client.hpp"

namespace moeserve::moectl {

namespace {

using nlohmann::json;

std::string PolicyName(const json& p) {
  const json m = p.value("metadata", json::object());
  return m.value("namespace", std::string("?")) + "/" + m.value("name", std::string("?"));
}

Error Malformed(const json& policy, const std::string& what) {
  return Error::InvalidArgument("QuotaPolicy " + PolicyName(policy) + ": " + what);
}

Result<std::string> Str(const json& o, const char* key, const json& policy, const std::string& where, bool required = true) {
  if (!o.contains(key) || o[key].is_null()) {
    if (required) return Fail(Malformed(policy, where + "." + key + " is missing"));
    return std::string();
  }
  if (!o[key].is_string()) return Fail(Malformed(policy, where + "." + key + " is not a string"));
  return o[key].get<std::string>();
}

Result<double> Num(const json& o, const char* key, const json& policy, const std::string& where, double absent) {
  if (!o.contains(key) || o[key].is_null()) return absent;
  if (!o[key].is_number()) return Fail(Malformed(policy, where + "." + key + " is not a number"));
  return o[key].get<double>();
}

// status.<field> as an array (absent or null: empty).
Result<json> StatusArray(const json& policy, const char* field) {
  const json status = policy.value("status", json::object());
  if (!status.is_object()) return Fail(Malformed(policy, "status is not an object"));
  if (!status.contains(field) || status[field].is_null()) return json::array();
  if (!status[field].is_array()) return Fail(Malformed(policy, std::string("status.") + field + " is not an array"));
  return status[field];
}

void Meta(const json& policy, std::string& ns, std::string& name) {
  const json m = policy.value("metadata", json::object());
  ns = m.value("namespace", std::string());
  name = m.value("name", std::string());
}

}  // namespace

Result<std::vector<json>> ListQuotaPolicies(const ClusterTarget& target) {
  auto config = op::ResolveKubeConfig(target.kubeconfig);
  if (!config) {
    return Fail(Error::NotFound("no cluster to read QuotaPolicies from: " + config.error().message() +
                                " (pass --kubeconfig PATH, set KUBECONFIG, or read a daemon with --daemon URL)"));
  }
  config->user_agent = "moectl";
  config->request_timeout_s = target.timeout_s;
  const std::string ns = target.all_namespaces ? "" : (target.ns.empty() ? config->namespace_name : target.ns);
  MOE_ASSIGN_OR_RETURN(auto client, op::KubeClient::Create(*config));
  auto list = client->ListAll(op::resources::kQuotaPolicy, ns);
  const std::string where = ns.empty() ? "in all namespaces" : "in namespace " + ns;
  if (!list) {
    const Error& e = list.error();
    if (e.code() == ErrorCode::kNotFound) {
      return Fail(Error::NotFound("the cluster at " + config->server + " has no QuotaPolicy resource (" + e.message() +
                                  "); are the moeserve CRDs installed?"));
    }
    if (e.code() == ErrorCode::kPermissionDenied) {
      return Fail(Error::PermissionDenied("the cluster at " + config->server + " refused to list QuotaPolicies " +
                                          where + ": " + e.message()));
    }
    return Fail(Error(e.code(), "cannot list QuotaPolicies " + where + " at " + config->server + ": " + e.message()));
  }
  if (!list->is_object() || !list->contains("items") || !(*list)["items"].is_array()) {
    return Fail(Error::InvalidArgument("the cluster at " + config->server + " answered a QuotaPolicy list without items"));
  }
  std::vector<json> out;
  for (const json& item : (*list)["items"]) {
    if (!item.is_object()) return Fail(Error::InvalidArgument("the QuotaPolicy list holds a non-object"));
    out.push_back(item);
  }
  std::sort(out.begin(), out.end(), [](const json& a, const json& b) { return PolicyName(a) < PolicyName(b); });
  return out;
}

Result<std::vector<UsageEntry>> UsageFromPolicies(const std::vector<json>& policies) {
  std::vector<UsageEntry> out;
  for (const json& p : policies) {
    MOE_ASSIGN_OR_RETURN(json usage, StatusArray(p, "usage"));
    for (size_t i = 0; i < usage.size(); ++i) {
      const json& u = usage[i];
      const std::string where = "status.usage[" + std::to_string(i) + "]";
      if (!u.is_object()) return Fail(Malformed(p, where + " is not an object"));
      UsageEntry e;
      Meta(p, e.ns, e.policy);
      MOE_ASSIGN_OR_RETURN(e.tenant, Str(u, "tenant", p, where));
      MOE_ASSIGN_OR_RETURN(e.period, Str(u, "period", p, where));
      MOE_ASSIGN_OR_RETURN(e.period_start, Str(u, "periodStart", p, where, false));
      MOE_ASSIGN_OR_RETURN(e.spent_usd, Num(u, "spentUSD", p, where, 0));
      if (u.contains("tokens") && !u["tokens"].is_null()) {
        const json& t = u["tokens"];
        if (!t.is_object()) return Fail(Malformed(p, where + ".tokens is not an object"));
        std::pair<const char*, int64_t*> fields[] = {{"input", &e.tokens.input},
                                                      {"cachedInput", &e.tokens.cached_input},
                                                      {"output", &e.tokens.output},
                                                      {"reasoning", &e.tokens.reasoning}};
        for (auto& [name, dst] : fields) {
          if (!t.contains(name)) continue;
          if (!t[name].is_number_integer()) return Fail(Malformed(p, where + ".tokens." + name + " is not an integer"));
          *dst = t[name].get<int64_t>();
        }
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

Result<std::vector<AlertEntry>> AlertsFromPolicies(const std::vector<json>& policies) {
  std::vector<AlertEntry> out;
  for (const json& p : policies) {
    MOE_ASSIGN_OR_RETURN(json alerts, StatusArray(p, "alerts"));
    for (size_t i = 0; i < alerts.size(); ++i) {
      const json& a = alerts[i];
      const std::string where = "status.alerts[" + std::to_string(i) + "]";
      if (!a.is_object()) return Fail(Malformed(p, where + " is not an object"));
      AlertEntry e;
      Meta(p, e.ns, e.policy);
      MOE_ASSIGN_OR_RETURN(e.tenant, Str(a, "tenant", p, where));
      MOE_ASSIGN_OR_RETURN(e.period, Str(a, "period", p, where));
      MOE_ASSIGN_OR_RETURN(e.period_start, Str(a, "periodStart", p, where, false));
      MOE_ASSIGN_OR_RETURN(e.threshold, Num(a, "threshold", p, where, 0));
      MOE_ASSIGN_OR_RETURN(e.fired_at, Str(a, "firedAt", p, where, false));
      MOE_ASSIGN_OR_RETURN(e.delivery_id, Str(a, "deliveryId", p, where, false));
      if (a.contains("delivered") && !a["delivered"].is_null()) {
        if (!a["delivered"].is_boolean()) return Fail(Malformed(p, where + ".delivered is not a boolean"));
        e.delivered = a["delivered"].get<bool>();
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

Result<std::vector<BudgetEntry>> BudgetsFromPolicies(const std::vector<json>& policies) {
  std::vector<BudgetEntry> out;
  MOE_ASSIGN_OR_RETURN(std::vector<UsageEntry> all_usage, UsageFromPolicies(policies));
  for (const json& p : policies) {
    std::string ns, name;
    Meta(p, ns, name);
    // The newest period of each tenant and period kind in this policy's status.
    std::map<std::pair<std::string, std::string>, const UsageEntry*> newest;
    for (const UsageEntry& u : all_usage) {
      if (u.ns != ns || u.policy != name) continue;
      auto& slot = newest[{u.tenant, u.period}];
      if (!slot || slot->period_start < u.period_start) slot = &u;  // RFC 3339 in UTC sorts as text
    }
    const json spec = p.value("spec", json::object());
    if (!spec.is_object()) return Fail(Malformed(p, "spec is not an object"));
    if (!spec.contains("budgets") || spec["budgets"].is_null()) continue;
    // Only the budgets: a pricing or hook problem is the operator's to report.
    MOE_ASSIGN_OR_RETURN(const BudgetPolicy policy,
                         ParseQuotaPolicyBudget(json{{"budgets", spec["budgets"]}}, "QuotaPolicy " + PolicyName(p) + " spec"));
    std::set<std::string> own;  // tenants with entries of their own follow only those
    for (const Budget& b : policy.budgets) {
      if (b.tenant != "*") own.insert(b.tenant);
    }
    for (const Budget& b : policy.budgets) {
      BudgetEntry e;
      e.ns = ns;
      e.policy = name;
      e.budget_tenant = b.tenant;
      e.period = PeriodName(b.period);
      e.limit_usd = b.limit_usd;
      e.action = BudgetActionName(b.action);
      e.thresholds = b.thresholds;
      std::vector<std::string> tenants;
      if (e.budget_tenant != "*") {
        tenants.push_back(e.budget_tenant);
      } else {
        for (const auto& [key, u] : newest) {
          if (key.second == e.period && !own.contains(key.first)) tenants.push_back(key.first);
        }
      }
      if (tenants.empty()) tenants.push_back("*");  // a "*" budget nobody has spent under yet
      for (const std::string& t : tenants) {
        BudgetEntry row = e;
        row.tenant = t;
        if (auto it = newest.find({t, e.period}); it != newest.end()) {
          row.spent_usd = it->second->spent_usd;
          row.period_start = it->second->period_start;
        }
        out.push_back(std::move(row));
      }
    }
  }
  return out;
}

}  // namespace moeserve::moectl

#include "moeserve/budget/quota_policy_budget.hpp"

#include <yaml-cpp/yaml.h>

namespace moeserve {

Result<BudgetPolicy> ParseQuotaPolicyBudget(const nlohmann::json& spec, const std::string& where) {
  BudgetPolicy policy;
  if (!spec.is_object()) return policy;
  for (const char* section : {"pricing", "budgets", "hooks"}) {
    auto it = spec.find(section);
    if (it == spec.end() || it->is_null()) continue;
    YAML::Node node;
    try {
      node = YAML::Load(it->dump());
    } catch (const YAML::Exception& e) {
      return Fail(Error::InvalidArgument(where + "." + section + ": " + e.what()));
    }
    MOE_TRY(ParseBudgetSection(policy, section, node, where));
  }
  return policy;
}

}  // namespace moeserve

#include "moeserve/daemon/keys/tenants.hpp"

#include "moeserve/common/yaml_scalar.hpp"

namespace moeserve::daemon {

TierSet TierBit(std::string_view tier) {
  if (tier == "low") return 1;
  if (tier == "medium") return 2;
  if (tier == "high") return 4;
  return 0;
}

std::string TierSetNames(TierSet s) {
  std::string out;
  for (const char* t : {"low", "medium", "high"}) {
    if (!(s & TierBit(t))) continue;
    if (!out.empty()) out += ", ";
    out += t;
  }
  return out.empty() ? "none" : out;
}

namespace {
Result<std::map<std::string, TierSet>> ParseTiers(const YAML::Node& tenants, const std::string& source) {
  std::map<std::string, TierSet> out;
  if (!tenants) return out;
  if (!tenants.IsMap()) {
    return Fail(Error::InvalidArgument(source + ": tenants: must be a map of tenant -> {tiers: [low, medium, high]}"));
  }
  for (const auto& kv : tenants) {
    MOE_ASSIGN_OR_RETURN(const std::string name, yaml::Key(kv.first, source + ": tenants"));
    const std::string where = source + ": tenants." + name;
    if (!kv.second.IsMap()) return Fail(Error::InvalidArgument(where + ": must be a map {tiers: [...]}"));
    for (const auto& field : kv.second) {
      MOE_ASSIGN_OR_RETURN(const std::string field_name, yaml::Key(field.first, where));
      if (field_name != "tiers") return Fail(Error::InvalidArgument(where + ": unknown field '" + field_name + "'"));
    }
    const YAML::Node tiers = kv.second["tiers"];
    if (!tiers || !tiers.IsSequence()) return Fail(Error::InvalidArgument(where + ".tiers: must be a list of tiers"));
    TierSet set = 0;
    size_t i = 0;
    for (const auto& t : tiers) {
      const std::string item = where + ".tiers[" + std::to_string(i++) + "]";
      MOE_ASSIGN_OR_RETURN(const std::string tier, yaml::Text(t, item));
      TierSet bit = TierBit(tier);
      if (!bit) return Fail(Error::InvalidArgument(item + ": must be low, medium or high"));
      set |= bit;
    }
    out[name] = set;
  }
  return out;
}
}  // namespace

Result<std::map<std::string, TierSet>> ParseTenantTiers(const YAML::Node& tenants, const std::string& source) {
  try {
    return ParseTiers(tenants, source);
  } catch (const YAML::Exception& e) {
    return Fail(Error::InvalidArgument(source + ": tenants: " + e.what()));
  }
}

}  // namespace moeserve::daemon

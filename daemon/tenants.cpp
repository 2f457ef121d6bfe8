#include "moeserve/daemon/tenants.hpp"

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
    const std::string name = kv.first.as<std::string>();
    const std::string where = source + ": tenants." + name;
    if (name.empty()) return Fail(Error::InvalidArgument(source + ": tenants: a tenant name must not be empty"));
    if (!kv.second.IsMap()) return Fail(Error::InvalidArgument(where + ": must be a map {tiers: [...]}"));
    for (const auto& field : kv.second) {
      if (field.first.as<std::string>() != "tiers") {
        return Fail(Error::InvalidArgument(where + ": unknown field '" + field.first.as<std::string>() + "'"));
      }
    }
    const YAML::Node tiers = kv.second["tiers"];
    if (!tiers || !tiers.IsSequence()) return Fail(Error::InvalidArgument(where + ".tiers: must be a list of tiers"));
    TierSet set = 0;
    for (const auto& t : tiers) {
      TierSet bit = t.IsScalar() ? TierBit(t.Scalar()) : 0;
      if (!bit) return Fail(Error::InvalidArgument(where + ".tiers: each must be low, medium or high"));
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

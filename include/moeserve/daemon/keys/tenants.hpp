// Tenants in the API keys file: which reasoning tiers each tenant may use.
//
//   tenants:
//     acme:  {tiers: [low, medium]}
//     "*":   {tiers: [low]}          # tenants without an entry; absent: every tier
//   keys:
//     - {key: sk-..., tenant: acme, role: user}
//
// A request for a tier its tenant may not use is refused (403
// tier_not_allowed). Parsed by ApiKeys::Parse, the one way a keys file
// becomes ApiKeys, so a reloaded file brings its tenants with it.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <yaml-cpp/yaml.h>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

// A set of tiers as bits: low 1, medium 2, high 4.
using TierSet = uint8_t;
inline constexpr TierSet kAllTiers = 7;
// The bit of "low" | "medium" | "high"; 0 for anything else.
TierSet TierBit(std::string_view tier);
// "low, medium" (for messages).
std::string TierSetNames(TierSet s);

// tenant (or "*") -> allowed tiers, from the file's optional `tenants` map.
Result<std::map<std::string, TierSet>> ParseTenantTiers(const YAML::Node& tenants, const std::string& source);

}  // namespace moeserve::daemon

// API keys: a YAML file (mounted from a Kubernetes Secret) that maps keys to
// tenants. Only the SHA-256 of each key is kept in memory and keys are never
// logged; a request is matched by hashing its bearer token.
//
//   keys:
//     - key: sk-live-abc           # or   sha256: <64 hex digits>; never blank or null
//       tenant: acme               # default "default"
//       role: admin                # optional; "admin" sees every tenant's usage
//   tenants:                       # optional (tenants.hpp): the tiers each tenant may use
//     acme: {tiers: [low, medium]}
//
// Thread safety: immutable after loading; share freely.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/keys/tenants.hpp"

namespace moeserve::daemon {

struct Principal {
  std::string tenant = "default";
  bool admin = false;
  TierSet tiers = kAllTiers;  // the tiers the tenant may use (the file's `tenants`)
};

class ApiKeys {
 public:
  // No file: every request is let in as tenant "default".
  static ApiKeys Open() { return ApiKeys(); }
  // Keys are required and none is valid: every request is refused (what a
  // keys file that stopped loading leaves in force, api_keys_reloader.hpp).
  static ApiKeys RefuseAll() {
    ApiKeys k;
    k.enabled_ = true;
    return k;
  }
  static Result<ApiKeys> LoadFile(const std::string& path);
  static Result<ApiKeys> Parse(const std::string& yaml_text, const std::string& source);

  bool enabled() const { return enabled_; }
  size_t size() const { return by_hash_.size(); }
  // The principal of an Authorization header value ("Bearer <key>"), or
  // nullopt when the header is missing, malformed or the key unknown.
  std::optional<Principal> Authenticate(std::string_view authorization_header) const;

 private:
  static Result<ApiKeys> ParseDocument(const YAML::Node& root, const std::string& source);

  bool enabled_ = false;
  std::unordered_map<std::string, Principal> by_hash_;  // hex sha256 -> principal
};

}  // namespace moeserve::daemon

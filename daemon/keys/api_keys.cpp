#include "moeserve/daemon/keys/api_keys.hpp"

#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/common/yaml_limits.hpp"
#include "moeserve/common/yaml_scalar.hpp"

namespace moeserve::daemon {

namespace {

// A key is sent as `Authorization: Bearer <key>`: HTTP trims the spaces
// around a header value and allows no control characters in it, so a key
// with either could never be presented as written. Refusing it here names
// the entry instead of leaving a key that silently never matches. The
// message never repeats the key.
Status CheckKeyText(const std::string& key, const std::string& where) {
  for (unsigned char c : key) {
    if (c < 0x20 || c == 0x7f) return Fail(Error::InvalidArgument(where + ": must not hold control characters or line breaks"));
  }
  if (key.front() == ' ' || key.back() == ' ') {
    return Fail(Error::InvalidArgument(where + ": must not begin or end with a space"));
  }
  return Ok();
}

}  // namespace

Result<ApiKeys> ApiKeys::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(Error::Io("API keys file " + path + ": cannot be opened"));
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

Result<ApiKeys> ApiKeys::Parse(const std::string& text, const std::string& source) {
  // yaml-cpp parses recursively: bound the text before it sees it. A key
  // entry is ~150 bytes, so 16 MiB is about a hundred thousand keys.
  MOE_TRY(CheckYamlLimits(text, {.max_bytes = 16u << 20, .max_depth = kMaxJsonDepth}, source));
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Fail(Error::InvalidArgument(source + ": not valid YAML: " + e.what()));
  }
  try {
    return ParseDocument(root, source);
  } catch (const YAML::Exception& e) {
    // Only a broken invariant of ours reaches here (every value is read
    // through yaml_scalar); the message carries no value.
    return Fail(Error::InvalidArgument(source + ": " + e.what()));
  }
}

Result<ApiKeys> ApiKeys::ParseDocument(const YAML::Node& root, const std::string& source) {
  if (!root.IsMap() || !root["keys"] || !root["keys"].IsSequence()) {
    return Fail(Error::InvalidArgument(source + ": expected a map with a 'keys' list of {key|sha256, tenant, role}"));
  }
  auto tiers = ParseTenantTiers(root["tenants"], source);
  if (!tiers) return Fail(tiers.error());
  auto tiers_of = [&](const std::string& tenant) {
    auto it = tiers->find(tenant);
    if (it == tiers->end()) it = tiers->find("*");
    return it == tiers->end() ? kAllTiers : it->second;
  };
  ApiKeys keys;
  keys.enabled_ = true;
  size_t i = 0;
  for (const auto& entry : root["keys"]) {
    std::string where = source + ": keys[" + std::to_string(i++) + "]";
    if (!entry.IsMap()) return Fail(Error::InvalidArgument(where + ": must be a map {key|sha256, tenant, role}"));
    for (const auto& field : entry) {
      MOE_ASSIGN_OR_RETURN(std::string name, yaml::Key(field.first, where));
      if (name != "key" && name != "sha256" && name != "tenant" && name != "role") {
        // A misspelt `tenant` would otherwise give the key to tenant "default".
        return Fail(Error::InvalidArgument(where + ": unknown field '" + name + "' (key, sha256, tenant, role)"));
      }
    }
    if (entry["key"] && entry["sha256"]) return Fail(Error::InvalidArgument(where + ": has both 'key' and 'sha256'"));
    std::string hash;
    if (entry["key"]) {
      MOE_ASSIGN_OR_RETURN(std::string key, yaml::Text(entry["key"], where + ".key"));
      MOE_TRY(CheckKeyText(key, where + ".key"));
      hash = Sha256Hex(std::string_view(key));
    } else if (entry["sha256"]) {
      MOE_ASSIGN_OR_RETURN(hash, yaml::Text(entry["sha256"], where + ".sha256"));
      if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return Fail(Error::InvalidArgument(where + ".sha256: must be 64 lowercase hex digits"));
      }
    } else {
      return Fail(Error::InvalidArgument(where + ": needs 'key' or 'sha256'"));
    }
    Principal p;
    if (entry["tenant"]) {
      MOE_ASSIGN_OR_RETURN(p.tenant, yaml::Text(entry["tenant"], where + ".tenant"));
    }
    p.tiers = tiers_of(p.tenant);
    if (entry["role"]) {
      MOE_ASSIGN_OR_RETURN(std::string role, yaml::Text(entry["role"], where + ".role"));
      if (role != "admin" && role != "user") {
        return Fail(Error::InvalidArgument(where + ".role: '" + role + "' is not admin or user"));
      }
      p.admin = role == "admin";
    }
    if (keys.by_hash_.contains(hash)) return Fail(Error::InvalidArgument(where + ": the same key is listed twice"));
    keys.by_hash_.emplace(hash, p);
  }
  if (keys.by_hash_.empty()) return Fail(Error::InvalidArgument(source + ": lists no keys; every request would be refused"));
  return keys;
}

std::optional<Principal> ApiKeys::Authenticate(std::string_view header) const {
  if (!enabled_) return Principal{};
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.substr(0, kBearer.size()) != kBearer) return std::nullopt;
  std::string_view key = header.substr(kBearer.size());
  // A hash lookup leaks nothing useful about keys through timing: the
  // attacker controls the input to SHA-256, not the comparison.
  auto it = by_hash_.find(Sha256Hex(key));
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

}  // namespace moeserve::daemon

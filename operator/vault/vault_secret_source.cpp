#include "moeserve/operator/vault_secret_source.hpp"

#include <cctype>

#include "moeserve/common/log.hpp"
#include "moeserve/operator/vault_paths.hpp"

namespace moeserve::op {
namespace {

// A Secret's data keys: [-._a-zA-Z0-9]+, at most 253 characters. Vault's
// keys are free text; one the API server would refuse is reported here.
bool SecretKeyName(const std::string& key) {
  if (key.empty() || key.size() > 253 || key == "." || key == "..") return false;
  for (unsigned char c : key)
    if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  return true;
}

}  // namespace

std::string VaultRoleOf(const std::string& ns, const std::string& role) { return role.empty() ? ns : role; }

Result<std::map<std::string, std::string>> VaultSecretSource::Fetch(const std::string& ns, const SecretReference& ref) {
  if (ref.vault_path.empty()) return Fail(Error::InvalidArgument("not a Vault reference"));
  // What is read is the path the platform's prefix checks judged (vault_paths.hpp).
  MOE_ASSIGN_OR_RETURN(const std::string path, CanonicalVaultPath(ref.vault_path, "vault.path"));
  const std::string role = VaultRoleOf(ns, ref.vault_role);
  for (int attempt = 0;; ++attempt) {
    auto token = sessions_.Token(ns, role);
    if (!token) return Fail(token.error());
    auto secret = vault_.ReadKv(*token, path);
    if (secret) {
      std::lock_guard lock(mu_);
      int64_t& seen = versions_[ns + "\n" + role + "\n" + path];
      if (seen != secret->version)
        log::Info("vault: " + path + " for namespace " + ns + " is at version " + std::to_string(secret->version));
      seen = secret->version;
      for (const auto& [key, value] : secret->data)
        if (!SecretKeyName(key))
          return Fail(Error::InvalidArgument("Vault read " + path + ": key \"" + key.substr(0, 64) +
                                             "\" is not a valid Secret key ([-._a-zA-Z0-9]+)"));
      return std::move(secret->data);
    }
    if (secret.error().code() != ErrorCode::kPermissionDenied || attempt > 0 || sessions_.development())
      return Fail(secret.error().WithContext("namespace " + ns + " role " + role));
    // Refused: by the policy, or because the token died (expired, revoked)?
    if (vault_.LookupSelf(*token)) return Fail(secret.error().WithContext("namespace " + ns + " role " + role));
    sessions_.Invalidate(ns, role, *token);
  }
}

Result<std::map<std::string, std::string>> RoutingSecretSource::Fetch(const std::string& ns,
                                                                        const SecretReference& ref) {
  if (!ref.vault_path.empty() && vault_) return vault_->Fetch(ns, ref);
  return secrets_.Fetch(ns, ref);  // a Vault path without Vault: kUnavailable from there
}

Status VaultCleanup::Cleanup(const json& md) {
  const std::string ns = md["metadata"].value("namespace", "");
  const json spec = md.value("spec", json::object());
  auto parsed = ParseMoEDeploymentSpec(spec);
  std::string role;
  if (parsed) {
    if (parsed->model_credentials.vault_path.empty() && parsed->api_keys.vault_path.empty()) return Ok();
    role = parsed->vault_role;
  } else if (spec.is_object() && spec.contains("vault") && spec["vault"].is_object()) {
    role = spec["vault"].value("role", "");
  }
  // The client has retried; a Vault that stays sealed or away must not hold
  // the deletion forever. The token then ends at its TTL.
  auto revoked = sessions_.Revoke(ns, VaultRoleOf(ns, role));
  if (!revoked)
    log::Warn("vault: could not revoke the token of namespace " + ns + " role " + VaultRoleOf(ns, role) + " (" +
              revoked.error().message() + "); it ends at its TTL");
  return Ok();
}

}  // namespace moeserve::op

#include "moeserve/operator/vault_paths.hpp"

#include "moeserve/operator/json_fields.hpp"
#include "moeserve/operator/quota_policy.hpp"

namespace moeserve::op {
namespace {

using fields::Field;
using fields::NameOf;
using fields::NamespaceOf;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Listed(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

}  // namespace

Result<std::string> CanonicalVaultPath(std::string_view path, std::string_view field) {
  const std::string where(field);
  // Quoted only when short printable ASCII: the path is the tenant's text,
  // and a cut multi-byte character would make the status unwritable.
  bool printable = path.size() <= 128;
  for (unsigned char c : path) printable = printable && c > 0x20 && c < 0x7f;
  const std::string shown = printable ? "\"" + std::string(path) + "\"" : "the path";
  std::string decoded;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      decoded.push_back(path[i]);
      continue;
    }
    const int hi = i + 2 < path.size() ? HexValue(path[i + 1]) : -1, lo = hi >= 0 ? HexValue(path[i + 2]) : -1;
    if (hi < 0 || lo < 0) return Fail(Error::InvalidArgument(where + ": " + shown + ": a % not followed by two hex digits"));
    decoded.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  std::string out;
  size_t start = 0;
  while (start <= decoded.size()) {
    const size_t end = std::min(decoded.find('/', start), decoded.size());
    const std::string segment = decoded.substr(start, end - start);
    start = end + 1;
    if (segment.empty() || segment == ".") continue;
    if (segment == "..")
      return Fail(Error::InvalidArgument(where + ": " + shown + ": a \"..\" segment is not allowed in a Vault path"));
    for (unsigned char c : segment)
      if (c <= 0x20 || c >= 0x7f || c == '%' || c == '?' || c == '#' || c == '\\')
        return Fail(Error::InvalidArgument(where + ": " + shown +
                                           ": not a Vault path (printable ASCII without spaces, %, ?, # or \\, "
                                           "even percent-encoded)"));
    out += (out.empty() ? "" : "/") + segment;
  }
  if (out.empty()) return Fail(Error::InvalidArgument(where + ": an empty Vault path"));
  return out;
}

bool UnderVaultPrefix(const std::string& path, const std::string& prefix) {
  if (prefix.empty() || path.size() < prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

Result<std::optional<std::vector<std::string>>> AllowedVaultPrefixes(const json& policy) {
  const json& vault = Field(Field(policy, "spec"), "vault");
  if (vault.is_null()) return std::optional<std::vector<std::string>>();
  if (!vault.is_object()) return Fail(Error::InvalidArgument("spec.vault: not an object"));
  const json& prefixes = Field(vault, "allowedPathPrefixes");
  if (prefixes.is_null()) return std::optional<std::vector<std::string>>();
  if (!prefixes.is_array()) return Fail(Error::InvalidArgument("spec.vault.allowedPathPrefixes: not a list"));
  std::vector<std::string> out;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    const std::string field = "spec.vault.allowedPathPrefixes[" + std::to_string(i) + "]";
    if (!prefixes[i].is_string()) return Fail(Error::InvalidArgument(field + ": not a string"));
    MOE_ASSIGN_OR_RETURN(std::string prefix, CanonicalVaultPath(prefixes[i].get<std::string>(), field));
    out.push_back(std::move(prefix));
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

Status CheckDeploymentVaultPath(const json& md, const std::string& field, const std::string& raw,
                                const std::vector<json>& policies, const std::string& reserved_prefix) {
  MOE_ASSIGN_OR_RETURN(std::string path, CanonicalVaultPath(raw, field));
  if (UnderVaultPrefix(path, reserved_prefix))
    return Fail(Error::PermissionDenied(field + ": " + path + " is under " + reserved_prefix +
                                        ", which is reserved for the platform's hook keys"));
  const std::string policy_name = GoverningPolicy(md, policies);
  std::optional<std::vector<std::string>> allowed;
  for (const auto& p : policies)
    if (!policy_name.empty() && NamespaceOf(p) == NamespaceOf(md) && NameOf(p) == policy_name) {
      auto parsed = AllowedVaultPrefixes(p);
      if (!parsed) return Fail(parsed.error().WithContext("QuotaPolicy " + policy_name));
      allowed = std::move(*parsed);
    }
  if (!allowed) return Ok();
  for (const auto& prefix : *allowed)
    if (UnderVaultPrefix(path, prefix)) return Ok();
  return Fail(Error::PermissionDenied(field + ": " + path + " is outside the Vault paths QuotaPolicy " + policy_name +
                                      " allows (spec.vault.allowedPathPrefixes " + Listed(*allowed) + ")"));
}

Status CheckDeploymentVaultPaths(const json& md, const MoEDeploymentSpec& spec, const std::vector<json>& policies,
                                 const std::string& reserved_prefix) {
  if (!spec.model_credentials.vault_path.empty())
    MOE_TRY(CheckDeploymentVaultPath(md, kCredentialsVaultPathField, spec.model_credentials.vault_path, policies,
                                     reserved_prefix));
  if (!spec.api_keys.vault_path.empty())
    MOE_TRY(CheckDeploymentVaultPath(md, kApiKeysVaultPathField, spec.api_keys.vault_path, policies, reserved_prefix));
  return Ok();
}

Status CheckDeploymentVaultRole(const json& md, const std::string& reserved_role) {
  if (reserved_role.empty()) return Ok();
  const json& meta = md.value("metadata", json::object());
  const std::string ns = meta.is_object() ? meta.value("namespace", "") : "";
  std::string role;
  const json spec = md.value("spec", json::object());
  if (spec.is_object() && spec.contains("vault") && spec["vault"].is_object() && spec["vault"].contains("role") &&
      spec["vault"]["role"].is_string())
    role = spec["vault"]["role"].get<std::string>();
  const bool named = !role.empty();
  if (role.empty()) role = ns;  // the namespace's own role by default (VaultRoleOf)
  if (role != reserved_role) return Ok();
  return Fail(Error::PermissionDenied(
      std::string(named ? "spec.vault.role: " : "spec.vault.role (unset, so the namespace's name): ") + role +
      " is the role moe-operator reads hook keys with (--hook-vault-role); no MoEDeployment may log in to Vault as it"));
}

Result<std::string> CheckHookVaultPath(const std::string& path, const std::string& hook_prefix, const std::string& ns) {
  if (hook_prefix.empty())
    return Fail(Error::PermissionDenied("a hook's secret.vault.path needs moe-operator --hook-vault-prefix (the Vault "
                                        "prefix reserved for hook keys, read with the operator's own role); none is "
                                        "configured"));
  MOE_ASSIGN_OR_RETURN(std::string canonical, CanonicalVaultPath(path, "secret.vault.path"));
  const std::string own = hook_prefix + "/" + ns;
  if (!UnderVaultPrefix(canonical, own) || canonical == own)
    return Fail(Error::PermissionDenied("secret.vault.path: " + canonical + " is not under " + own +
                                        "/, where the hook keys of namespace " + ns + " are kept"));
  return canonical;
}

}  // namespace moeserve::op

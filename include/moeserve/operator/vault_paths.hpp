// Which Vault paths a MoEDeployment may name, and which ones a QuotaPolicy
// hook may: tenants' paths (spec.model.credentials.vault.path,
// spec.endpoint.apiKeys.vault.path) are copied into the tenant's own
// `<name>-secrets`, so they must stay where the platform lets that tenant
// read; hook keys (the HMAC keys that sign cost alerts) are the platform's
// and live under a prefix reserved for them (moe-operator
// --hook-vault-prefix), which no MoEDeployment may name.
//
// Paths are compared in canonical form, and the canonical form is what the
// operator reads, so what was checked is what is fetched: percent-encoding
// decoded once (a `%` left after that is refused: a second decoding by a
// proxy or by Vault could otherwise turn `%252e%252e` into `..`), empty and
// `.` segments dropped (`a//b/./c/` is `a/b/c`), and a `..` segment refused
// (Vault's router would resolve it past the prefix). Characters that would
// end the path in a URL (`?`, `#`), backslashes, spaces, control bytes and
// anything past ASCII are refused too. Prefixes match whole segments: `secret/data/team-a` covers
// `secret/data/team-a/s3`, never `secret/data/team-ab/s3`.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/operator/moedeployment.hpp"

namespace moeserve::op {

// `path` in canonical form. kInvalidArgument naming `field` when it cannot
// be one (empty, `..`, a `%` after decoding, a bad character).
Result<std::string> CanonicalVaultPath(std::string_view path, std::string_view field);

// Whether canonical `path` is `prefix` or lies below it (whole segments).
// An empty prefix covers nothing.
bool UnderVaultPrefix(const std::string& path, const std::string& prefix);

// A QuotaPolicy's spec.vault.allowedPathPrefixes, canonical; nullopt when
// the policy sets none (Vault's own policies alone decide). Errors name the field.
Result<std::optional<std::vector<std::string>>> AllowedVaultPrefixes(const json& policy);

inline constexpr char kCredentialsVaultPathField[] = "spec.model.credentials.vault.path";
inline constexpr char kApiKeysVaultPathField[] = "spec.endpoint.apiKeys.vault.path";

// Whether `md` may name Vault path `path` in `field`: not under
// `reserved_prefix` (canonical; "" = none reserved), and, when the
// QuotaPolicy governing md among `policies` sets
// spec.vault.allowedPathPrefixes, under one of them. kPermissionDenied
// naming the field, the path and the allowed prefixes; kInvalidArgument for
// a path that has no canonical form or a policy whose field is malformed.
Status CheckDeploymentVaultPath(const json& md, const std::string& field, const std::string& path,
                                const std::vector<json>& policies, const std::string& reserved_prefix);
// The same for both of `spec`'s Vault paths (the webhook's check).
Status CheckDeploymentVaultPaths(const json& md, const MoEDeploymentSpec& spec, const std::vector<json>& policies,
                                 const std::string& reserved_prefix);

// Whether `md` may log in to Vault as the role it names (spec.vault.role,
// or its namespace's name when unset): never as `reserved_role`, the role
// the operator reads hook keys with (--hook-vault-role; "" = none). Vault's
// own binding of that role to the operator's ServiceAccount refuses such a
// login too; this refusal names the field before any login is tried.
// kPermissionDenied naming spec.vault.role.
Status CheckDeploymentVaultRole(const json& md, const std::string& reserved_role);

// Where the hooks of QuotaPolicies in namespace `ns` keep their keys:
// `<hook_prefix>/<ns>`. A hook's path must lie below it, so one namespace's
// policy cannot sign with another's key. `path` is returned canonical.
Result<std::string> CheckHookVaultPath(const std::string& path, const std::string& hook_prefix, const std::string& ns);

}  // namespace moeserve::op

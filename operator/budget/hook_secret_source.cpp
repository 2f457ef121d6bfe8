#include "moeserve/operator/hook_secret_source.hpp"

#include "moeserve/common/base64.hpp"
#include "moeserve/operator/vault_paths.hpp"

namespace moeserve::op {

Result<std::map<std::string, std::string>> HookSecretSource::Fetch(const std::string& ns, const SecretReference& ref) {
  if (!ref.vault_path.empty()) {
    MOE_ASSIGN_OR_RETURN(std::string path, CheckHookVaultPath(ref.vault_path, options_.vault_prefix, ns));
    if (!vault_) return Fail(Error::Unavailable("Vault is not configured in this operator; cannot read " + path));
    SecretReference own;
    own.vault_path = path;
    own.vault_role = options_.vault_role;
    // The operator's namespace and role: the tenant namespace's login is never used for a hook key.
    return vault_->Fetch(options_.operator_namespace, own);
  }
  const std::string where = "Secret " + options_.operator_namespace + "/" + ref.secret_name;
  MOE_ASSIGN_OR_RETURN(json secret, kube_.Get(resources::kSecret, options_.operator_namespace, ref.secret_name));
  const json labels = secret["metadata"].value("labels", json::object());
  if (!labels.is_object() || labels.value(kHookNamespaceLabel, "") != ns)
    return Fail(Error::PermissionDenied(where + " is not labelled " + kHookNamespaceLabel + "=" + ns +
                                        "; only such Secrets hold the hook keys of namespace " + ns));
  std::map<std::string, std::string> out;
  const json data = secret.value("data", json::object());
  if (data.is_object())
    for (const auto& [k, v] : data.items())
      if (v.is_string()) out[k] = Base64Decode(v.get<std::string>());
  return out;
}

}  // namespace moeserve::op

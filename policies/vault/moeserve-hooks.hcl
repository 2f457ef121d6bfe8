# Vault policy for the moeserve-hooks role: read the signing keys of
# QuotaPolicy hooks, and nothing else. They live under moe-operator's
# --hook-vault-prefix (here kv/data/moeserve-hooks), one folder per policy
# namespace (kv/data/moeserve-hooks/team-a/...). No team's policy may cover
# this prefix, and no MoEDeployment may name a path under it (the operator
# refuses one): a receiver trusts a correctly signed alert as the platform's.
#
# moe-operator reads these keys as itself: a TokenRequest token of the
# `moeserve-vault` ServiceAccount in its own namespace (audience `vault`),
# logging in as role --hook-vault-role. The role binding (run once):
#
#   vault policy write moeserve-hooks policies/vault/moeserve-hooks.hcl
#   vault write auth/kubernetes/role/moeserve-hooks \
#       bound_service_account_names=moeserve-vault \
#       bound_service_account_namespaces=moeserve-system \
#       audience=vault policies=moeserve-hooks ttl=1h

path "kv/data/moeserve-hooks/*" {
  capabilities = ["read"]
}

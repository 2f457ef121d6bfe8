# Vault policy for team-a's role: read the team's KV v2 secrets and nothing
# else. Copy it per team, replacing team-a with the team's namespace name
# (a MoEDeployment's Vault role defaults to its namespace's name).
#
# moe-operator logs in for a namespace as that namespace's `moeserve-vault`
# ServiceAccount (a TokenRequest token, audience `vault`) with the role
# named by spec.vault.role, so Vault's policies, not the operator, decide
# what each team may read: a MoEDeployment in team-a naming
# kv/data/team-b/... gets Vault's 403. A MoEDeployment's vault.path is the
# API path after /v1/; for KV v2 that includes data/, which is what this
# policy grants (the secret at kv/team-a/object-store is read as
# GET /v1/kv/data/team-a/object-store).
#
# The operator reads Vault with its own identity only for budget hooks'
# signing keys (moeserve-hooks.hcl), which no team's policy may cover:
# a team that read them could forge its cost alerts. The role binding (run
# once per team):
#
#   vault policy write team-a policies/vault/team-a.hcl
#   vault write auth/kubernetes/role/team-a \
#       bound_service_account_names=moeserve-vault \
#       bound_service_account_namespaces=team-a \
#       audience=vault policies=team-a ttl=1h

path "kv/data/team-a/*" {
  capabilities = ["read"]
}

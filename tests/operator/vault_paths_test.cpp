// Vault path canonicalisation and prefix checks (vault_paths.hpp): every
// spelling that reaches a reserved or foreign path (`..`, `//`, `./`,
// trailing slashes, percent-encoding) is either refused or compared in the
// form that is actually read; prefixes match whole segments; a QuotaPolicy's
// spec.vault.allowedPathPrefixes is read with errors naming the field.
#include <gtest/gtest.h>

#include "moeserve/operator/vault_paths.hpp"

namespace moeserve::op {
namespace {

using nlohmann::json;

constexpr char kField[] = "spec.model.credentials.vault.path";
constexpr char kHooks[] = "secret/data/moeserve-hooks";

TEST(VaultPaths, CanonicalFormDropsEmptyAndDotSegmentsAndDecodesOnce) {
  for (const auto& [raw, want] : std::vector<std::pair<std::string, std::string>>{
           {"secret/data/team-a/s3", "secret/data/team-a/s3"},
           {"/secret//data/./team-a/s3/", "secret/data/team-a/s3"},
           {"secret/data/%74eam-a/s3", "secret/data/team-a/s3"},
           {"secret%2Fdata%2fteam-a%2Fs3", "secret/data/team-a/s3"},
       }) {
    auto canonical = CanonicalVaultPath(raw, kField);
    ASSERT_TRUE(canonical) << raw << ": " << canonical.error().message();
    EXPECT_EQ(*canonical, want) << raw;
  }
}

TEST(VaultPaths, SpellingsThatCouldEscapeAPrefixAreRefusedNamingTheField) {
  for (const std::string raw : {"secret/data/team-a/../moeserve-hooks/team-a/sre",
                                "secret/data/team-a/%2e%2e/moeserve-hooks/team-a/sre",
                                "secret/data/team-a/%2E%2E%2Fmoeserve-hooks/team-a/sre",
                                "secret/data/team-a/%252e%252e/moeserve-hooks",  // decoded twice elsewhere
                                "secret/data/team-a/s3?version=1", "secret/data/team-a/s3#x",
                                "secret/data/team-a\\..\\moeserve-hooks", "secret/data/team a", "secret/data/%",
                                "secret/data/%zz", "secret/data/%00", "secret/data/\xc3\xa9", "", "/", "./"}) {
    auto canonical = CanonicalVaultPath(raw, kField);
    ASSERT_FALSE(canonical) << raw << " became " << *canonical;
    EXPECT_EQ(canonical.error().code(), ErrorCode::kInvalidArgument) << raw;
    EXPECT_EQ(canonical.error().message().rfind(kField, 0), 0u) << canonical.error().message();
  }
}

TEST(VaultPaths, PrefixesMatchWholeSegments) {
  EXPECT_TRUE(UnderVaultPrefix("secret/data/team-a/s3", "secret/data/team-a"));
  EXPECT_TRUE(UnderVaultPrefix("secret/data/team-a", "secret/data/team-a"));
  EXPECT_FALSE(UnderVaultPrefix("secret/data/team-ab/s3", "secret/data/team-a"));
  EXPECT_FALSE(UnderVaultPrefix("secret/data", "secret/data/team-a"));
  EXPECT_FALSE(UnderVaultPrefix("secret/data/team-a/s3", ""));
}

json Deployment(const std::string& credentials_path, const std::string& policy = "") {
  json md = {{"metadata", {{"name", "m"}, {"namespace", "team-a"}}}, {"spec", json::object()}};
  if (!policy.empty()) md["spec"]["quotaPolicyRef"] = {{"name", policy}};
  md["spec"]["model"]["credentials"]["vault"]["path"] = credentials_path;
  return md;
}

MoEDeploymentSpec SpecWith(const std::string& credentials_path) {
  MoEDeploymentSpec spec;
  spec.model_credentials.vault_path = credentials_path;
  return spec;
}

json Policy(const std::string& name, json vault) {
  return {{"metadata", {{"name", name}, {"namespace", "team-a"}}}, {"spec", {{"vault", vault}}}};
}

TEST(VaultPaths, TheReservedHookPrefixIsRefusedHoweverItIsSpelled) {
  for (const std::string path : {"secret/data/moeserve-hooks/team-a/sre", "secret//data/moeserve-hooks/team-a/sre/",
                                 "secret/data/%6Doeserve-hooks/team-a/sre", "./secret/data/moeserve-hooks"}) {
    Status allowed = CheckDeploymentVaultPaths(Deployment(path), SpecWith(path), {}, kHooks);
    ASSERT_FALSE(allowed) << path;
    EXPECT_EQ(allowed.error().code(), ErrorCode::kPermissionDenied) << path;
    EXPECT_NE(allowed.error().message().find(std::string(kField) + ": " + kHooks), std::string::npos)
        << allowed.error().message();
    EXPECT_NE(allowed.error().message().find("reserved for the platform's hook keys"), std::string::npos);
  }
  // A sibling that only shares the text is not under it.
  const std::string sibling = "secret/data/moeserve-hooks-archive/x";
  EXPECT_TRUE(CheckDeploymentVaultPaths(Deployment(sibling), SpecWith(sibling), {}, kHooks));
}

TEST(VaultPaths, TheGoverningPolicysAllowedPrefixesBoundBothPaths) {
  const std::vector<json> policies = {Policy("default", {{"allowedPathPrefixes", {"secret/data/team-a/models/"}}}),
                                      Policy("open", json::object())};
  const std::string inside = "secret/data/team-a/models/s3", outside = "secret/data/team-a/s3";
  EXPECT_TRUE(CheckDeploymentVaultPaths(Deployment(inside), SpecWith(inside), policies, kHooks));
  Status refused = CheckDeploymentVaultPaths(Deployment(outside), SpecWith(outside), policies, kHooks);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(refused.error().message(),
            "spec.model.credentials.vault.path: secret/data/team-a/s3 is outside the Vault paths QuotaPolicy default "
            "allows (spec.vault.allowedPathPrefixes [secret/data/team-a/models])");
  // The API keys' path too.
  MoEDeploymentSpec keys;
  keys.api_keys.vault_path = outside;
  refused = CheckDeploymentVaultPaths(Deployment(inside), keys, policies, kHooks);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().message().rfind("spec.endpoint.apiKeys.vault.path: ", 0), 0u) << refused.error().message();
  // A policy without the field leaves it to Vault; the hook prefix stays refused.
  EXPECT_TRUE(CheckDeploymentVaultPaths(Deployment(outside, "open"), SpecWith(outside), policies, kHooks));
  const std::string hook = "secret/data/moeserve-hooks/team-a/sre";
  EXPECT_FALSE(CheckDeploymentVaultPaths(Deployment(hook, "open"), SpecWith(hook), policies, kHooks));
}

TEST(VaultPaths, AMalformedAllowListRefusesAndNamesTheField) {
  const std::string path = "secret/data/team-a/s3";
  for (const auto& [vault, field] : std::vector<std::pair<json, std::string>>{
           {json("all"), "spec.vault: not an object"},
           {{{"allowedPathPrefixes", "secret/"}}, "spec.vault.allowedPathPrefixes: not a list"},
           {{{"allowedPathPrefixes", {1}}}, "spec.vault.allowedPathPrefixes[0]: not a string"},
           {{{"allowedPathPrefixes", {"secret/data/team-a", "secret/../x"}}}, "spec.vault.allowedPathPrefixes[1]: "}}) {
    Status allowed = CheckDeploymentVaultPaths(Deployment(path), SpecWith(path), {Policy("default", vault)}, kHooks);
    ASSERT_FALSE(allowed) << vault.dump();
    EXPECT_NE(allowed.error().message().find(field), std::string::npos) << allowed.error().message();
    EXPECT_NE(allowed.error().message().find("QuotaPolicy default"), std::string::npos) << allowed.error().message();
  }
}

TEST(VaultPaths, AHooksPathMustLieUnderItsOwnNamespacesPlace) {
  auto own = CheckHookVaultPath("secret/data/moeserve-hooks/team-a//sre/", kHooks, "team-a");
  ASSERT_TRUE(own) << own.error().message();
  EXPECT_EQ(*own, "secret/data/moeserve-hooks/team-a/sre");
  for (const std::string path : {"secret/data/moeserve-hooks/team-b/sre", "secret/data/team-a/hook",
                                 "secret/data/moeserve-hooks/team-a", "secret/data/moeserve-hooks/team-a-x/sre"}) {
    auto refused = CheckHookVaultPath(path, kHooks, "team-a");
    ASSERT_FALSE(refused) << path;
    EXPECT_EQ(refused.error().code(), ErrorCode::kPermissionDenied);
    EXPECT_NE(refused.error().message().find("secret.vault.path: "), std::string::npos) << refused.error().message();
  }
  EXPECT_FALSE(CheckHookVaultPath("secret/data/moeserve-hooks/team-a/../team-b/sre", kHooks, "team-a"));
  auto unconfigured = CheckHookVaultPath("secret/data/moeserve-hooks/team-a/sre", "", "team-a");
  ASSERT_FALSE(unconfigured);
  EXPECT_NE(unconfigured.error().message().find("--hook-vault-prefix"), std::string::npos);
}

TEST(VaultPaths, NoDeploymentLogsInAsTheHookRole) {
  json md = {{"metadata", {{"name", "m"}, {"namespace", "team-a"}}}, {"spec", {{"vault", {{"role", "moeserve-hooks"}}}}}};
  Status named = CheckDeploymentVaultRole(md, "moeserve-hooks");
  ASSERT_FALSE(named);
  EXPECT_EQ(named.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_NE(named.error().message().find("spec.vault.role: moeserve-hooks is the role"), std::string::npos)
      << named.error().message();
  // Unset: the namespace's name is the role, so a namespace of that name cannot use it either.
  json by_namespace = {{"metadata", {{"name", "m"}, {"namespace", "moeserve-hooks"}}}, {"spec", json::object()}};
  EXPECT_FALSE(CheckDeploymentVaultRole(by_namespace, "moeserve-hooks"));
  md["spec"]["vault"]["role"] = "team-a-models";
  EXPECT_TRUE(CheckDeploymentVaultRole(md, "moeserve-hooks"));
  EXPECT_TRUE(CheckDeploymentVaultRole(by_namespace, ""));  // no hook role configured
}

}  // namespace
}  // namespace moeserve::op

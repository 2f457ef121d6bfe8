// Keys, attacked as a tenant would: before, a MoEDeployment without apiKeys
// ran a daemon that served anyone on 0.0.0.0 (and /metrics, with tenant
// names, to anyone). Now every deployment has an operator-generated admin
// key (in a Secret of the operator's own namespace) and metrics token (in
// its Secret), kept stable across reconciles and operator restarts;
// api-keys.yaml always lists the admin key (as a hash), the serve config
// always names the keys and the metrics token, and nothing in the tenant's
// namespace holds the admin key in plain text.
#include <gtest/gtest.h>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

std::map<std::string, std::string> SecretData(fakes::FakeApiServer& server, const std::string& ns, const std::string& name) {
  std::map<std::string, std::string> out;
  auto secret = server.Get("secrets", ns, name);
  if (!secret) return out;
  for (const auto& [k, v] : (*secret)["data"].items()) out[k] = Base64Decode(v.get<std::string>());
  return out;
}

bool IsHexToken(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(Keys, EveryDeploymentHasAnAdminKeyAndMetricsTokenThatStay) {
  FakeCluster cluster;
  auto& server = cluster.server;
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "open", 1, 1)));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "other", 1, 1)));
  std::map<std::string, std::string> first;
  {
    auto client = cluster.Client();
    RunningOperator running(*client, {});
    ASSERT_TRUE(WaitFor([&] { return SecretData(server, "team-a", "open-secrets").count(kApiKeysKey) == 1; }));
    ASSERT_TRUE(WaitFor([&] { return SecretData(server, "team-a", "other-secrets").count(kApiKeysKey) == 1; }));
    ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps", "team-a").size() == 2; }));
    first = SecretData(server, "team-a", "open-secrets");
    EXPECT_EQ(first.count(kAdminKeyKey), 0u) << "the admin key is in the tenant's namespace";
    first[kAdminKeyKey] = AdminKeyOf(server, "team-a", "open");
    EXPECT_TRUE(IsHexToken(first[kAdminKeyKey])) << first[kAdminKeyKey];
    EXPECT_TRUE(IsHexToken(first[kMetricsTokenKey])) << first[kMetricsTokenKey];
    EXPECT_NE(first[kAdminKeyKey], first[kMetricsTokenKey]);
    // Per deployment: another deployment's keys are its own.
    auto other = SecretData(server, "team-a", "other-secrets");
    other[kAdminKeyKey] = AdminKeyOf(server, "team-a", "other");
    EXPECT_NE(other[kAdminKeyKey], first[kAdminKeyKey]);
    EXPECT_NE(other[kMetricsTokenKey], first[kMetricsTokenKey]);

    // api-keys.yaml: the admin entry, as a hash.
    json keys = json::parse(first[kApiKeysKey]);
    ASSERT_EQ(keys["keys"].size(), 1u) << keys.dump();
    EXPECT_EQ(keys["keys"][0]["tenant"], kAdminTenant);
    EXPECT_EQ(keys["keys"][0]["role"], "admin");
    EXPECT_EQ(keys["keys"][0]["sha256"], Sha256Hex(first[kAdminKeyKey]));
    EXPECT_EQ(first[kApiKeysKey].find(first[kAdminKeyKey]), std::string::npos);

    // The serve config: keys always on, the metrics token required.
    json serve = json::parse((*server.Get("configmaps", "team-a", "open-config"))["data"]["config.yaml"].get<std::string>());
    EXPECT_EQ(serve["api_keys_file"], std::string(kSecretsDir) + "/api-keys.yaml");
    EXPECT_EQ(serve["metrics_token_file"], std::string(kSecretsDir) + "/metrics-token");
    EXPECT_EQ(serve["host"], "0.0.0.0");
    EXPECT_FALSE(serve.contains("allow_unauthenticated"));

    // The tenant's container mounts what the daemon reads, not the admin key.
    auto sts = *server.Get("statefulsets.apps", "team-a", "open-r0");
    for (const auto& v : sts["spec"]["template"]["spec"]["volumes"]) {
      if (v["name"] != "secrets") continue;
      std::set<std::string> mounted;
      for (const auto& item : v["secret"]["items"]) mounted.insert(item["key"]);
      EXPECT_EQ(mounted, (std::set<std::string>{kApiKeysKey, kMetricsTokenKey}));
    }

    // Reconciles do not mint new keys.
    for (int i = 0; i < 3; ++i) {
      const uint64_t before = running.op.reconciles();
      ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "open",
                                [i](json& o) { o["metadata"]["labels"]["touch"] = std::to_string(i); }));
      ASSERT_TRUE(WaitFor([&] { return running.op.reconciles() > before; }));
    }
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(AdminKeyOf(server, "team-a", "open"), first[kAdminKeyKey]);
  }
  // Nor does a new operator process, which reads them back.
  auto client = cluster.Client();
  RunningOperator again(*client, {});
  ASSERT_TRUE(WaitFor([&] { return again.op.reconciles() >= 2; }));
  std::this_thread::sleep_for(300ms);
  auto after = SecretData(server, "team-a", "open-secrets");
  EXPECT_EQ(AdminKeyOf(server, "team-a", "open"), first[kAdminKeyKey]);
  EXPECT_EQ(after[kMetricsTokenKey], first[kMetricsTokenKey]);
  EXPECT_EQ(after[kApiKeysKey], first[kApiKeysKey]);
}

TEST(Keys, TenantKeysJoinTheAdminKeyAndBadOnesAreRefused) {
  FakeCluster cluster;
  auto& server = cluster.server;
  json keys_secret = {{"apiVersion", "v1"}, {"kind", "Secret"},
                      {"metadata", {{"name", "keys"}, {"namespace", "team-a"}, {"labels", {{kUsableLabel, "true"}}}}},
                      {"stringData", {{"acme", "sk-acme"}, {"globex", "sk-globex"}}}};
  ASSERT_TRUE(server.Create("secrets", keys_secret));
  json manifest = MoEDeploymentManifest("team-a", "m", 1, 1);
  manifest["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "keys"}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  auto client = cluster.Client();
  OperatorOptions options;
  options.reconciler.secret_resync = 100ms;
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return SecretData(server, "team-a", "m-secrets").count(kApiKeysKey) == 1; }));
  auto data = SecretData(server, "team-a", "m-secrets");
  data[kAdminKeyKey] = AdminKeyOf(server, "team-a", "m");
  json file = json::parse(data[kApiKeysKey]);
  ASSERT_EQ(file["keys"].size(), 3u) << file.dump();
  EXPECT_EQ(file["keys"][0]["role"], "admin");
  EXPECT_EQ(file["keys"][1], (json{{"sha256", Sha256Hex("sk-acme")}, {"tenant", "acme"}, {"role", "user"}}));
  EXPECT_EQ(file["keys"][2], (json{{"sha256", Sha256Hex("sk-globex")}, {"tenant", "globex"}, {"role", "user"}}));

  // A tenant entry that would take the admin's name is refused, the last good file kept.
  ASSERT_TRUE(server.Mutate("secrets", "team-a", "keys", [](json& o) {
    o["data"][kAdminTenant] = Base64Encode("sk-pretend-admin");
  }));
  ASSERT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "InvalidApiKeys"; }))
      << ConditionOf(server, "team-a", "m", "SecretsSynced").dump();
  EXPECT_EQ(SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-pretend-admin")), std::string::npos);
  EXPECT_EQ(SecretData(server, "team-a", "m-secrets")[kApiKeysKey], data[kApiKeysKey]);
  EXPECT_EQ(AdminKeyOf(server, "team-a", "m"), data[kAdminKeyKey]);
}

TEST(Keys, AnAdminKeyPlantedBeforehandIsNotTrusted) {
  // The tenant creates "<name>-secrets" before the deployment, with an admin key it knows.
  FakeCluster cluster;
  auto& server = cluster.server;
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "m-secrets"}, {"namespace", "team-a"},
                                                      {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}}}},
                                        {"stringData", {{kAdminKeyKey, "known-to-the-tenant"}, {kMetricsTokenKey, "known-too"}}}}));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m", 1, 1)));
  auto client = cluster.Client();
  RunningOperator running(*client, {});
  ASSERT_TRUE(WaitFor([&] { return IsHexToken(SecretData(server, "team-a", "m-secrets")[kMetricsTokenKey]); }));
  auto data = SecretData(server, "team-a", "m-secrets");
  EXPECT_NE(data[kMetricsTokenKey], "known-too");
  EXPECT_EQ(data.count(kAdminKeyKey), 0u);
  EXPECT_EQ(data[kApiKeysKey].find(Sha256Hex("known-to-the-tenant")), std::string::npos);
}

TEST(Keys, APlantedSecretIsNotKeptAsTheLastGoodOne) {
  // As above, with a failure that would keep the last good Secret (a missing tenant-keys Secret).
  FakeCluster cluster;
  auto& server = cluster.server;
  json planted_keys = {{"keys", json::array({{{"key", "known-to-the-tenant"}, {"tenant", "me"}, {"role", "admin"}}})}};
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "m-secrets"}, {"namespace", "team-a"},
                                                      {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}}}},
                                        {"stringData", {{kApiKeysKey, planted_keys.dump()}}}}));
  json manifest = MoEDeploymentManifest("team-a", "m", 1, 1);
  manifest["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "not-there-yet"}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  auto client = cluster.Client();
  RunningOperator running(*client, {});
  ASSERT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "SecretNotFound"; }));
  ASSERT_TRUE(WaitFor([&] { return IsHexToken(SecretData(server, "team-a", "m-secrets")[kMetricsTokenKey]); }));
  EXPECT_EQ(SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find("known-to-the-tenant"), std::string::npos);
}

// Revocation: a tenant takes its keys away by deleting their Secret. The
// operator used to keep the last good copy forever (SecretNotFound "may
// pass"), so the deleted keys went on working; now a keys Secret that is gone
// leaves api-keys.yaml with the admin key alone, even while another
// reference's failure keeps the rest of the last good Secret.
TEST(Keys, DeletingTheKeysSecretRevokesItsKeysAndKeepsTheOperatorsOwn) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto usable = [](const std::string& name, json string_data) {
    return json{{"apiVersion", "v1"}, {"kind", "Secret"},
                {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", {{kUsableLabel, "true"}}}}},
                {"stringData", std::move(string_data)}};
  };
  ASSERT_TRUE(server.Create("secrets", usable("keys", {{"acme", "sk-acme"}, {"globex", "sk-globex"}})));
  ASSERT_TRUE(server.Create("secrets", usable("creds", {{"AWS_ACCESS_KEY_ID", "AKIA-1"}})));
  json manifest = MoEDeploymentManifest("team-a", "m", 1, 1);
  manifest["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "keys"}}}};
  manifest["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "creds"}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  auto client = cluster.Client();
  OperatorOptions options;
  options.reconciler.secret_resync = 100ms;
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-acme")) != std::string::npos;
  }));
  auto before = SecretData(server, "team-a", "m-secrets");
  before[kAdminKeyKey] = AdminKeyOf(server, "team-a", "m");

  // 1. The keys Secret is deleted: its keys go, the admin key and metrics token stay.
  ASSERT_TRUE(server.Delete("secrets", "team-a", "keys"));
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-acme")) == std::string::npos;
  })) << "the deleted Secret's keys are still in api-keys.yaml";
  auto after = SecretData(server, "team-a", "m-secrets");
  json file = json::parse(after[kApiKeysKey]);
  ASSERT_EQ(file["keys"].size(), 1u) << file.dump();
  EXPECT_EQ(file["keys"][0], (json{{"sha256", Sha256Hex(before.at(kAdminKeyKey))}, {"tenant", kAdminTenant}, {"role", "admin"}}));
  EXPECT_EQ(AdminKeyOf(server, "team-a", "m"), before.at(kAdminKeyKey));
  EXPECT_EQ(after[kMetricsTokenKey], before.at(kMetricsTokenKey));
  EXPECT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "SecretNotFound"; }));
  const json synced = ConditionOf(server, "team-a", "m", "SecretsSynced");
  EXPECT_EQ(synced.value("status", ""), "False");
  EXPECT_NE(synced.value("message", "").find("its keys are revoked"), std::string::npos) << synced.dump();

  // 2. Back with one key: that one serves again.
  ASSERT_TRUE(server.Create("secrets", usable("keys", {{"globex", "sk-globex"}})));
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-globex")) != std::string::npos;
  }));
  EXPECT_EQ(SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-acme")), std::string::npos);

  // 3. Both Secrets deleted: the credentials' last good copy is kept (a
  //    missing credentials Secret may come back), the keys are still revoked.
  ASSERT_TRUE(server.Delete("secrets", "team-a", "creds"));
  ASSERT_TRUE(server.Delete("secrets", "team-a", "keys"));
  ASSERT_TRUE(WaitFor([&] {
    return SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex("sk-globex")) == std::string::npos;
  })) << "the deleted Secret's keys are still in api-keys.yaml";
  after = SecretData(server, "team-a", "m-secrets");
  EXPECT_EQ(after[std::string(kObjectStorePrefix) + "AWS_ACCESS_KEY_ID"], "AKIA-1");
  EXPECT_EQ(json::parse(after[kApiKeysKey])["keys"].size(), 1u);
  EXPECT_EQ(AdminKeyOf(server, "team-a", "m"), before.at(kAdminKeyKey));
}

// A key removed in the same edit that breaks the keys Secret (an empty
// key, a repeated one) used to live on: the malformed Secret kept the whole
// last good file. Now the last good file serves less the keys the Secret no
// longer holds; and while another reference's failure keeps the rest of the
// last good Secret, good new keys replace the old ones at once.
TEST(Keys, ARemovedKeyStaysRemovedWhateverElseFails) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto usable = [](const std::string& name, json string_data) {
    return json{{"apiVersion", "v1"}, {"kind", "Secret"},
                {"metadata", {{"name", name}, {"namespace", "team-a"}, {"labels", {{kUsableLabel, "true"}}}}},
                {"stringData", std::move(string_data)}};
  };
  ASSERT_TRUE(server.Create("secrets", usable("keys", {{"acme", "sk-acme"}, {"globex", "sk-globex"}, {"initech", "sk-initech"}})));
  ASSERT_TRUE(server.Create("secrets", usable("creds", {{"AWS_ACCESS_KEY_ID", "AKIA-1"}})));
  json manifest = MoEDeploymentManifest("team-a", "m", 1, 1);
  manifest["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "keys"}}}};
  manifest["spec"]["model"]["credentials"] = {{"secretRef", {{"name", "creds"}}}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  auto client = cluster.Client();
  OperatorOptions options;
  options.reconciler.secret_resync = 100ms;
  RunningOperator running(*client, options);
  auto file = [&] { return SecretData(server, "team-a", "m-secrets")[kApiKeysKey]; };
  ASSERT_TRUE(WaitFor([&] { return file().find(Sha256Hex("sk-initech")) != std::string::npos; }));

  // 1. acme removed, and an entry with an empty key added in the same edit.
  ASSERT_TRUE(server.Mutate("secrets", "team-a", "keys", [](json& o) {
    o["data"].erase("acme");
    o["data"]["typo"] = "";
  }));
  ASSERT_TRUE(WaitFor([&] { return file().find(Sha256Hex("sk-acme")) == std::string::npos; }))
      << "the removed key lives on in the last good file";
  // Status follows the Secret in the same reconcile.
  EXPECT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "InvalidApiKeys"; }));
  EXPECT_NE(file().find(Sha256Hex("sk-globex")), std::string::npos);
  EXPECT_NE(file().find(Sha256Hex("sk-initech")), std::string::npos);
  EXPECT_EQ(json::parse(file())["keys"][0]["role"], "admin");

  // 2. The credentials Secret goes (a failure that keeps the last good
  //    Secret), and the keys are fixed without globex: globex goes at once.
  ASSERT_TRUE(server.Delete("secrets", "team-a", "creds"));
  ASSERT_TRUE(server.Mutate("secrets", "team-a", "keys", [](json& o) {
    o["data"].erase("typo");
    o["data"].erase("globex");
  }));
  ASSERT_TRUE(WaitFor([&] { return file().find(Sha256Hex("sk-globex")) == std::string::npos; }))
      << "a key removed while another reference failed lives on";
  EXPECT_NE(file().find(Sha256Hex("sk-initech")), std::string::npos);
  EXPECT_TRUE(WaitFor([&] { return ConditionOf(server, "team-a", "m", "SecretsSynced").value("reason", "") == "SecretNotFound"; }));
  EXPECT_EQ(SecretData(server, "team-a", "m-secrets")[std::string(kObjectStorePrefix) + "AWS_ACCESS_KEY_ID"], "AKIA-1");
}

// The admin key, attacked as a tenant would: it used to sit in plain text in
// the tenant's <name>-secrets, so anyone who could read that Secret (every
// tenant with `get secrets`, which the tenant role grants) could call the
// daemon's admin endpoints (set the global spend, read every tenant's usage)
// with the operator's own key. Now the tenant's namespace holds only its
// hash (api-keys.yaml); the key is in a Secret of the operator's namespace,
// made for this deployment's uid alone and deleted with it. A key an older
// operator left in the tenant's Secret is dropped and replaced.
TEST(Keys, ReadingTheTenantsSecretDoesNotGiveTheAdminKey) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  FakeCluster cluster;
  auto& server = cluster.server;
  // As an older operator left it: the plain admin key in the deployment's own Secret.
  auto md = server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m", 1, 1));
  ASSERT_TRUE(md);
  const std::string leaked = "admin-key-an-older-operator-left-in-the-tenants-namespace";
  const json old_keys = {{"keys", json::array({{{"sha256", Sha256Hex(leaked)}, {"tenant", kAdminTenant}, {"role", "admin"}}})}};
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "m-secrets"}, {"namespace", "team-a"},
                                                      {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}},
                                                      {"ownerReferences", json::array({desired::OwnerReference(*md)})}}},
                                        {"stringData", {{kAdminKeyKey, leaked}, {kApiKeysKey, old_keys.dump()}}}}));
  // A Secret of the same name in the operator's namespace, made for another
  // deployment of that name (another uid): its key is not this one's.
  const std::string stale = "admin-key-of-an-earlier-deployment-of-the-same-name";
  json stale_secret = desired::AdminSecret(*md, "moeserve-system", stale);
  stale_secret["metadata"]["labels"][kOwnerUidLabel] = "uid-of-an-earlier-deployment";
  ASSERT_TRUE(server.Create("secrets", stale_secret));

  auto client = cluster.Client();
  RunningOperator running(*client, {});
  ASSERT_TRUE(WaitFor([&] {
    return IsHexToken(AdminKeyOf(server, "team-a", "m")) &&
           SecretData(server, "team-a", "m-secrets")[kApiKeysKey].find(Sha256Hex(AdminKeyOf(server, "team-a", "m"))) !=
               std::string::npos;
  })) << "no admin key of this deployment's own in the operator's namespace";
  const std::string admin_key = AdminKeyOf(server, "team-a", "m");
  EXPECT_NE(admin_key, leaked);
  EXPECT_NE(admin_key, stale);

  // What a tenant reads: no value is, or holds, the admin key; the leaked
  // and the stale keys no longer open the daemon.
  Kubectl kubectl(server);
  auto got = kubectl("get secret m-secrets -n team-a -o json");
  ASSERT_EQ(got.rc, 0) << got.output;
  const json tenant_view = json::parse(got.output, nullptr, false);
  ASSERT_TRUE(tenant_view.is_object()) << got.output;
  EXPECT_FALSE(tenant_view["data"].contains(kAdminKeyKey)) << got.output;
  for (const auto& [k, v] : tenant_view["data"].items())
    EXPECT_EQ(Base64Decode(v.get<std::string>()).find(admin_key), std::string::npos) << k << " holds the admin key";
  const json file = json::parse(Base64Decode(tenant_view["data"][kApiKeysKey].get<std::string>()));
  ASSERT_EQ(file["keys"].size(), 1u) << file.dump();
  EXPECT_EQ(file["keys"][0], (json{{"sha256", Sha256Hex(admin_key)}, {"tenant", kAdminTenant}, {"role", "admin"}}));

  // The key's Secret is this deployment's, by uid, and goes with it.
  auto admin_secret = server.Get("secrets", "moeserve-system", desired::AdminSecretName(*md));
  ASSERT_TRUE(admin_secret);
  EXPECT_EQ((*admin_secret)["metadata"]["labels"].value(kOwnerUidLabel, ""), (*md)["metadata"].value("uid", ""));
  ASSERT_TRUE(server.Delete("moedeployments.moeserve.io", "team-a", "m"));
  ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "m"); }));
  EXPECT_FALSE(server.Get("secrets", "moeserve-system", desired::AdminSecretName(*md)))
      << "the admin key outlived its deployment";
}

}  // namespace
}  // namespace moeserve::op::testing

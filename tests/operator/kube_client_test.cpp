// The Kubernetes client against the API double: kubeconfig and in-cluster
// configuration (token file re-read when it changes), CRUD, 409 on a stale
// update, the patch types, server-side apply conflicts, status subresource,
// watches; and moe-operator's metrics and health endpoints.
#include "../support/loopback.hpp"
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cpprest/http_client.h>

#include <filesystem>
#include <fstream>

#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

std::filesystem::path TempDir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

TEST(KubeConfig, ReadsTheCurrentContext) {
  auto dir = TempDir("moe-kc");
  std::ofstream(dir / "config") << R"(apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: dev
  cluster: {server: https://dev:6443}
- name: prod
  cluster:
    server: https://prod.example:6443
    certificate-authority-data: Q0EtUEVN
contexts:
- name: dev
  context: {cluster: dev, user: dev}
- name: prod
  context: {cluster: prod, user: admin, namespace: team-a}
users:
- name: dev
  user: {token: nope}
- name: admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
    token: t0ken
)";
  auto c = LoadKubeconfig((dir / "config").string());
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->server, "https://prod.example:6443");
  EXPECT_EQ(c->ca_data, "CA-PEM");
  EXPECT_EQ(c->client_cert_data, "CERT");
  EXPECT_EQ(c->client_key_data, "KEY");
  EXPECT_EQ(c->token, "t0ken");
  EXPECT_EQ(c->namespace_name, "team-a");
  EXPECT_FALSE(c->insecure_skip_tls_verify);

  std::ofstream(dir / "bad") << "apiVersion: v1\nkind: Config\ncurrent-context: missing\ncontexts: []\n";
  auto bad = LoadKubeconfig((dir / "bad").string());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("context \"missing\" not found"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(KubeClient, InClusterTokenIsReReadWhenItChanges) {
  FakeCluster cluster;
  auto dir = TempDir("moe-sa");
  std::ofstream(dir / "token") << "first-token\n";
  std::ofstream(dir / "namespace") << "team-a";
  const std::string port = cluster.server.url().substr(cluster.server.url().rfind(':') + 1);
  setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", port.c_str(), 1);
  setenv("MOESERVE_INCLUSTER_SCHEME", "http", 1);  // the double speaks plain HTTP
  auto config = InClusterConfig(dir.string());
  ASSERT_TRUE(config) << config.error().ToString();
  EXPECT_EQ(config->namespace_name, "team-a");
  auto client = KubeClient::Create(*config);
  ASSERT_TRUE(client);
  ASSERT_TRUE((*client)->Get(resources::kNamespace, "", "team-a"));
  EXPECT_EQ(cluster.server.LastBearerToken(), "first-token");
  std::this_thread::sleep_for(20ms);  // a distinct modification time
  std::ofstream(dir / "token") << "rotated-token\n";
  ASSERT_TRUE((*client)->Get(resources::kNamespace, "", "team-a"));
  EXPECT_EQ(cluster.server.LastBearerToken(), "rotated-token");
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  std::filesystem::remove_all(dir);
}

TEST(KubeClient, CrudPatchesConflictsAndStatus) {
  FakeCluster cluster;
  auto client = cluster.Client();
  json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
             {"metadata", {{"name", "c"}, {"namespace", "team-a"}}}, {"data", {{"a", "1"}}}};
  auto created = client->Create(resources::kConfigMap, "team-a", cm);
  ASSERT_TRUE(created) << created.error().ToString();
  auto dup = client->Create(resources::kConfigMap, "team-a", cm);
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().code(), ErrorCode::kConflict);  // AlreadyExists

  json v1 = *created;
  json v2 = v1;
  v2["data"]["a"] = "2";
  auto updated = client->Update(resources::kConfigMap, v2);
  ASSERT_TRUE(updated);
  EXPECT_NE((*updated)["metadata"]["resourceVersion"], v1["metadata"]["resourceVersion"]);
  v1["data"]["a"] = "stale";
  auto stale = client->Update(resources::kConfigMap, v1);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code(), ErrorCode::kConflict);
  EXPECT_NE(stale.error().message().find("the object has been modified"), std::string::npos);

  auto merged = client->Patch(resources::kConfigMap, "team-a", "c", "application/merge-patch+json",
                              {{"data", {{"b", "x"}, {"a", nullptr}}}});
  ASSERT_TRUE(merged);
  EXPECT_EQ((*merged)["data"], json({{"b", "x"}}));

  // Strategic merge: containers merge by name, env by name.
  json sts = {{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"},
              {"metadata", {{"name", "s"}, {"namespace", "team-a"}}},
              {"spec", {{"replicas", 1}, {"template", {{"spec", {{"containers", json::array({
                  {{"name", "a"}, {"image", "a:1"}, {"env", json::array({{{"name", "X"}, {"value", "1"}}})}},
                  {{"name", "b"}, {"image", "b:1"}}})}}}}}}}};
  ASSERT_TRUE(client->Create(resources::kStatefulSet, "team-a", sts));
  auto smp = client->Patch(resources::kStatefulSet, "team-a", "s", "application/strategic-merge-patch+json",
                           {{"spec", {{"template", {{"spec", {{"containers", json::array({
                               {{"name", "a"}, {"env", json::array({{{"name", "Y"}, {"value", "2"}}})}}})}}}}}}}});
  ASSERT_TRUE(smp) << smp.error().ToString();
  const json containers = (*smp)["spec"]["template"]["spec"]["containers"];
  ASSERT_EQ(containers.size(), 2u);
  EXPECT_EQ(containers[0]["image"], "a:1");
  EXPECT_EQ(containers[0]["env"].size(), 2u);
  EXPECT_EQ((*smp)["metadata"]["generation"], 2);
  // Custom resources refuse strategic merge, as the apiserver does.
  ASSERT_TRUE(client->Create(resources::kMoEDeployment, "team-a", MoEDeploymentManifest("team-a", "m", 1, 1)));
  auto crd_smp = client->Patch(resources::kMoEDeployment, "team-a", "m", "application/strategic-merge-patch+json",
                               {{"spec", {{"replicas", 2}}}});
  ASSERT_FALSE(crd_smp);

  // Status subresource: the main resource ignores status, /status ignores spec.
  json md = *client->Get(resources::kMoEDeployment, "team-a", "m");
  EXPECT_EQ(md["metadata"]["generation"], 1);
  md["status"] = {{"phase", "Ready"}};
  md["spec"]["replicas"] = 3;
  auto main_put = client->Update(resources::kMoEDeployment, md);
  ASSERT_TRUE(main_put);
  EXPECT_FALSE((*main_put).contains("status"));
  EXPECT_EQ((*main_put)["metadata"]["generation"], 2);
  json st = *main_put;
  st["status"] = {{"phase", "Ready"}};
  st["spec"]["replicas"] = 9;
  auto status_put = client->UpdateStatus(resources::kMoEDeployment, st);
  ASSERT_TRUE(status_put);
  EXPECT_EQ((*status_put)["status"]["phase"], "Ready");
  EXPECT_EQ((*status_put)["spec"]["replicas"], 3);
  EXPECT_EQ((*status_put)["metadata"]["generation"], 2);
  // The schema is checked on status too.
  st = *status_put;
  st["status"]["phase"] = "Sleeping";
  auto bad_status = client->UpdateStatus(resources::kMoEDeployment, st);
  ASSERT_FALSE(bad_status);
  EXPECT_EQ(bad_status.error().code(), ErrorCode::kInvalidArgument);

  // Server-side apply: two managers, a conflict, then force.
  json applied = {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                  {"metadata", {{"name", "ssa"}, {"namespace", "team-a"}}}, {"data", {{"k", "one"}}}};
  ASSERT_TRUE(client->Patch(resources::kConfigMap, "team-a", "ssa", "application/apply-patch+yaml", applied, "",
                            "manager-one"));
  applied["data"]["k"] = "two";
  auto conflict = client->Patch(resources::kConfigMap, "team-a", "ssa", "application/apply-patch+yaml", applied, "",
                                "manager-two");
  ASSERT_FALSE(conflict);
  EXPECT_EQ(conflict.error().code(), ErrorCode::kConflict);
  EXPECT_NE(conflict.error().message().find("conflict with \"manager-one\": .data.k"), std::string::npos)
      << conflict.error().message();
  auto forced = client->Patch(resources::kConfigMap, "team-a", "ssa", "application/apply-patch+yaml", applied, "",
                              "manager-two", /*force=*/true);
  ASSERT_TRUE(forced) << forced.error().ToString();
  EXPECT_EQ((*forced)["data"]["k"], "two");
  // A manager dropping a field it alone applied removes it.
  applied["data"] = {{"other", "v"}};
  auto dropped = client->Patch(resources::kConfigMap, "team-a", "ssa", "application/apply-patch+yaml", applied, "",
                               "manager-two");
  ASSERT_TRUE(dropped);
  EXPECT_EQ((*dropped)["data"], json({{"other", "v"}}));

  // Finalizers hold deletion; removing the last one completes it.
  json fin = {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
              {"metadata", {{"name", "f"}, {"namespace", "team-a"}, {"finalizers", {"x/y"}}}}};
  ASSERT_TRUE(client->Create(resources::kConfigMap, "team-a", fin));
  ASSERT_TRUE(client->Delete(resources::kConfigMap, "team-a", "f"));
  auto held = client->Get(resources::kConfigMap, "team-a", "f");
  ASSERT_TRUE(held);
  EXPECT_TRUE((*held)["metadata"].contains("deletionTimestamp"));
  (*held)["metadata"]["finalizers"] = json::array();
  ASSERT_TRUE(client->Update(resources::kConfigMap, *held));
  auto gone = client->Get(resources::kConfigMap, "team-a", "f");
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code(), ErrorCode::kNotFound);
}

TEST(KubeClient, WatchStreamsEventsFromAResourceVersion) {
  FakeCluster cluster;
  auto client = cluster.Client();
  auto list = client->List(resources::kConfigMap, "team-a");
  ASSERT_TRUE(list);
  const std::string rv = (*list)["metadata"]["resourceVersion"];
  ASSERT_TRUE(cluster.server.Create("configmaps", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                                   {"metadata", {{"name", "w"}, {"namespace", "team-a"}}}}));
  ASSERT_TRUE(cluster.server.Delete("configmaps", "team-a", "w"));
  std::vector<std::string> types;
  WatchOptions options;
  options.resource_version = rv;
  options.timeout_seconds = 1;
  auto ended = client->Watch(resources::kConfigMap, "team-a", options,
                             [&](const std::string& type, const json&) { types.push_back(type); });
  ASSERT_TRUE(ended) << ended.error().ToString();
  EXPECT_EQ(*ended, WatchEnd::kClosed);
  ASSERT_GE(types.size(), 2u);
  EXPECT_EQ(types[0], "ADDED");
  EXPECT_EQ(types[1], "DELETED");
  cluster.server.CompactHistory();
  auto gone = client->Watch(resources::kConfigMap, "team-a", options, [](const std::string&, const json&) {});
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, WatchEnd::kGone);
}

TEST(Operator, MetricsAndHealthEndpoints) {
  FakeCluster cluster;
  auto client = cluster.Client();
  ASSERT_TRUE(cluster.server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m", 1, 1)));
  OperatorOptions options;
  const int metrics_port = test_support::FreeLoopbackPort(), health_port = test_support::FreeLoopbackPort();
  options.metrics_addr = "127.0.0.1:" + std::to_string(metrics_port);
  options.health_addr = "127.0.0.1:" + std::to_string(health_port);
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return StatusOf(cluster.server, "team-a", "m").value("phase", "") == "Pulling"; }));
  auto get = [](int port, const std::string& path) -> std::pair<int, std::string> {
    try {
      web::http::client::http_client c("http://127.0.0.1:" + std::to_string(port));
      auto resp = c.request(web::http::methods::GET, path).get();
      return {resp.status_code(), resp.extract_utf8string(true).get()};
    } catch (const std::exception& e) {
      return {0, e.what()};
    }
  };
  auto healthz = get(health_port, "/healthz");
  EXPECT_EQ(healthz.first, 200);
  EXPECT_EQ(get(health_port, "/readyz").first, 200);
  auto metrics = get(metrics_port, "/metrics");
  ASSERT_EQ(metrics.first, 200) << metrics.second;
  for (const char* name : {"moe_operator_reconcile_total", "moe_operator_reconcile_errors_total",
                           "moe_operator_reconcile_duration_seconds_bucket", "moe_operator_workqueue_depth",
                           "moe_operator_leader"})
    EXPECT_NE(metrics.second.find(name), std::string::npos) << name;
  EXPECT_NE(metrics.second.find("result=\"success\""), std::string::npos);
}

}  // namespace
}  // namespace moeserve::op::testing

namespace moeserve::op::testing {
namespace {

TEST(KubeClient, ListsPageWithContinueTokens) {
  FakeCluster cluster;
  auto client = cluster.Client();
  for (int i = 0; i < 23; ++i)
    ASSERT_TRUE(cluster.server.Create("configmaps", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                                     {"metadata", {{"name", "p" + std::to_string(i)}, {"namespace", "team-a"}}}}));
  ListOptions page;
  page.limit = 10;
  auto first = client->List(resources::kConfigMap, "team-a", page);
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)["items"].size(), 10u);
  ASSERT_FALSE((*first)["metadata"].value("continue", "").empty());
  auto all = client->ListAll(resources::kConfigMap, "team-a", page);
  ASSERT_TRUE(all);
  EXPECT_EQ((*all)["items"].size(), 23u);
  EXPECT_EQ((*all)["metadata"]["resourceVersion"], (*first)["metadata"]["resourceVersion"]);
  // A continue token from before a compaction is 410 Expired.
  cluster.server.CompactHistory();
  (void)cluster.server.Create("configmaps", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                             {"metadata", {{"name", "late"}, {"namespace", "team-a"}}}});
  page.continue_token = (*first)["metadata"]["continue"];
  auto expired = client->List(resources::kConfigMap, "team-a", page);
  ASSERT_FALSE(expired);
  EXPECT_NE(expired.error().message().find("410"), std::string::npos) << expired.error().message();
}

}  // namespace
}  // namespace moeserve::op::testing

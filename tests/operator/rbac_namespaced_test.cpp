// The chart's namespaced mode, run: with operator.watchNamespaces and
// cache.storageClassName set, moe-operator (started with the rendered
// Deployment's arguments, against the chart installed with kubectl) serves a
// MoEDeployment in a watched namespace through its whole life (made, its
// admin key kept in the operator's namespace, deleted through the finalizer)
// with only the grants those values bind: Secrets and pods in the watched
// namespace (a RoleBinding there), nothing on PersistentVolumes (its cache
// claim asks the storage class). A MoEDeployment in another namespace is
// left alone: no call reads a Secret or a pod there.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "chart_support.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

constexpr char kOperatorNamespace[] = "moeserve-system";

TEST(RbacNamespaced, TheOperatorWorksWithinTheNamespacesItIsGranted) {
  ASSERT_TRUE(std::filesystem::exists(OperatorBinary())) << "build moe-operator first: " << OperatorBinary();
  ASSERT_TRUE(HaveKubectl()) << "kubectl is not installed (scripts/setup installs it)";
  FakeCluster cluster;
  auto& server = cluster.server;
  (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}});

  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  SetValue(*values, "operator.watchNamespaces", json::array({"team-a"}));
  SetValue(*values, "cache.storageClassName", "local-path");
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kOperatorNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();
  const std::vector<BoundRole> bound = OperatorRoles(*chart, kOperatorNamespace);
  Kubectl kubectl(server);
  ASSERT_EQ(InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kOperatorNamespace}), "");
  ASSERT_TRUE(server.Get("rolebindings.rbac.authorization.k8s.io", "team-a", "moeserve-operator-tenant-objects"));

  const int webhook_port = FreePort();
  ASSERT_GT(webhook_port, 0);
  server.admission().MapService(kOperatorNamespace, "moeserve-webhook", {webhook_port});
  const std::string kubeconfig =
      (std::filesystem::temp_directory_path() / ("moe-rbac-ns-" + std::to_string(getpid()) + ".yaml")).string();
  ASSERT_TRUE(server.WriteKubeconfig(kubeconfig));
  auto args = ChartArguments(*chart, kOperatorNamespace, "moeserve-operator-0");
  for (const char* extra : {"--metrics-addr=0", "--health-addr=0"}) args.push_back(extra);
  args.push_back("--webhook-addr=127.0.0.1:" + std::to_string(webhook_port));
  args.push_back("--kubeconfig=" + kubeconfig);

  // The unwatched namespace's first, so that it would be reconciled first were it seen.
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-b", "elsewhere", 1, 1)));
  auto md = server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "mine", 1, 1));
  ASSERT_TRUE(md);
  {
    OperatorProcess op(args);
    ASSERT_TRUE(op.running());
    ASSERT_TRUE(WaitFor([&] {
      return server.Get("statefulsets.apps", "team-a", "mine-r0") && server.Get("secrets", "team-a", "mine-secrets") &&
             !StatusOf(server, "team-a", "mine").value("phase", "").empty();
    }, 30s)) << StatusOf(server, "team-a", "mine").dump(2);
    EXPECT_FALSE(AdminKeyOf(server, "team-a", "mine").empty());
    // The cache claim asks the storage class; no volume is made for it.
    auto claim = server.Get("persistentvolumeclaims", "team-a", "mine-cache");
    ASSERT_TRUE(claim);
    EXPECT_EQ((*claim)["spec"].value("storageClassName", ""), "local-path");
    EXPECT_FALSE((*claim)["spec"].contains("volumeName")) << claim->dump(2);
    EXPECT_TRUE(server.List("persistentvolumes").empty());

    ASSERT_TRUE(server.Delete("moedeployments.moeserve.io", "team-a", "mine"));
    ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "mine"); }, 30s));
    EXPECT_EQ(AdminKeyOf(server, "team-a", "mine"), "") << "the admin key outlived its deployment";
    EXPECT_EQ(op.Stop(), 0);
  }
  std::filesystem::remove(kubeconfig);
  // The one in team-b was never touched.
  EXPECT_TRUE(StatusOf(server, "team-b", "elsewhere").empty()) << StatusOf(server, "team-b", "elsewhere").dump(2);
  EXPECT_FALSE(server.Get("secrets", "team-b", "elsewhere-secrets"));

  std::set<std::string> missing, outside;
  size_t calls = 0;
  for (const auto& c : server.Requests()) {
    if (c.user_agent.rfind("moe-operator/", 0) != 0) continue;
    calls++;
    bool allowed = false;
    for (const auto& b : bound)
      allowed = allowed || ((b.ns.empty() || b.ns == c.ns) && RoleAllows(b.role, c.verb, c.group, c.resource, c.subresource, c.name));
    const std::string what = c.verb + " " + c.resource + (c.ns.empty() ? " (cluster)" : " in " + c.ns);
    if (!allowed) missing.insert(what);
    if ((c.resource == "secrets" || c.resource == "pods") && c.ns != "team-a" && c.ns != kOperatorNamespace)
      outside.insert(what);
    if (c.resource == "persistentvolumes") outside.insert(what);
  }
  EXPECT_GT(calls, 0u);
  for (const auto& m : missing) ADD_FAILURE() << "the chart does not grant a call the operator made: " << m;
  for (const auto& o : outside) ADD_FAILURE() << "a call outside what the namespaced mode needs: " << o;
}

}  // namespace
}  // namespace moeserve::op::testing

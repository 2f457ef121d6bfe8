// moe-operator accepts every argument the chart's Deployment can give it:
// with the default values and with every optional switch turned on
// (cert-manager, Vault with its CA file, one watched namespace, a shared
// cache), the operator started with the rendered arguments takes the Lease
// in the release namespace and stops cleanly on SIGTERM. A flag the chart
// passes and the operator does not know makes it exit at once instead.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chart_support.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

constexpr char kNamespace[] = "moeserve-system";

void StartsWith(const std::vector<std::pair<std::string, json>>& overrides) {
  ASSERT_TRUE(std::filesystem::exists(OperatorBinary())) << "build moe-operator first: " << OperatorBinary();
  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  for (const auto& [k, v] : overrides) SetValue(*values, k, v);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();

  FakeCluster cluster;
  (void)cluster.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                             {"metadata", {{"name", kNamespace}}}});  // FakeCluster may have made it
  const auto dir = std::filesystem::temp_directory_path() / ("moe-chart-args-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(cluster.server.WriteKubeconfig((dir / "kubeconfig").string()));
  // The Vault CA ConfigMap's mount, as a file here.
  std::ofstream(dir / "ca.crt") << "";
  std::vector<std::string> args;
  for (auto a : ChartArguments(*chart, kNamespace, "moeserve-operator-0")) {
    if (a == "--vault-cacert=/etc/moeserve/vault-ca/ca.crt") a = "--vault-cacert=" + (dir / "ca.crt").string();
    args.push_back(a);
  }
  for (const char* extra : {"--metrics-addr=0", "--health-addr=0"}) args.push_back(extra);
  args.push_back("--webhook-addr=127.0.0.1:" + std::to_string(FreePort()));
  args.push_back("--kubeconfig=" + (dir / "kubeconfig").string());

  OperatorProcess op(args);
  ASSERT_TRUE(op.running());
  std::optional<int> exited;
  const bool leads = WaitFor([&] {
    if ((exited = op.Exited())) return true;
    auto lease = cluster.server.Get("leases.coordination.k8s.io", kNamespace, "moe-operator-leader");
    return lease && (*lease)["spec"].value("holderIdentity", "") == "moeserve-operator-0";
  }, 20s);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(exited.has_value()) << "moe-operator exited with " << *exited << " on the chart's arguments: "
                                   << json(args).dump();
  ASSERT_TRUE(leads) << "never took the Lease in " << kNamespace;
  EXPECT_EQ(op.Stop(), 0);
}

TEST(ChartOperatorArgs, DefaultValues) { StartsWith({}); }

TEST(ChartOperatorArgs, EveryOptionalSwitchOn) {
  StartsWith({{"webhook.certManager.enabled", true},
              {"vault.addr", "http://127.0.0.1:1"},
              {"vault.allowInsecureHttp", true},
              {"vault.namespace", "platform"},
              {"vault.caCert.enabled", true},
              {"operator.watchNamespace", "team-a"},
              {"cache.shared", true},
              {"cache.capacityGi", 100},
              {"daemon.runAsUser", 1000}});
}

TEST(ChartOperatorArgs, WatchedNamespacesAndACacheStorageClass) {
  StartsWith({{"operator.watchNamespaces", json::array({"team-a", "team-b"})}, {"cache.storageClassName", "local-path"}});
}

}  // namespace
}  // namespace moeserve::op::testing

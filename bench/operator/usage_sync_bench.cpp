// bench_usage_sync: how long one usage sync of a QuotaPolicy takes as the
// number of daemon pods grows. For each N, an in-process operator against
// the API double runs the sync every second over N/2 MoEDeployments of two
// replicas; each node-rank-0 pod is a real moe-daemon (its HTTP API and
// ledger; no model is loaded, /v1/usage and /v1/admin/spend do not need
// one) on its own loopback address, configured from the operator's
// config.yaml, its ledger holding `--tenants` tenants x 3 tiers x 2 periods.
// A sync reads every pod (16 at a time), commits the ConfigMap, pushes the
// spend to every pod and writes status. Prints the sync time after a
// warm-up, min / median / max over `--syncs` syncs.
//
//   bench_usage_sync [--pods 4,16,64] [--tenants 20] [--syncs 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../../tests/support/loopback.hpp"
#include "fake_apiserver.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/daemon.hpp"
#include "moeserve/daemon/usage/usage_ledger.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/operator.hpp"

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

bool WaitFor(const std::function<bool()>& pred, std::chrono::seconds timeout = 120s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

// One run with `pods` node-rank-0 pods; returns the sync times in ms.
std::vector<double> Run(int pods, int tenants, int syncs, const fs::path& dir) {
  using namespace moeserve;
  fakes::FakeApiServer server;
  for (const char* f : {"/crds/moeserve.io_moedeployments.yaml", "/crds/moeserve.io_quotapolicies.yaml"})
    if (!server.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR) + f)) return {};
  server.Start(0);
  for (const char* ns : {"bench", "moeserve-system"})  // the operator's namespace holds the budget record
    server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  json price = {{"input", 0.4}, {"cachedInput", 0.04}, {"output", 1.6}, {"reasoning", 1.6}};
  server.Create("quotapolicies.moeserve.io",
                {{"apiVersion", "moeserve.io/v1alpha1"},
                 {"kind", "QuotaPolicy"},
                 {"metadata", {{"name", "bench"}, {"namespace", "bench"}}},
                 {"spec",
                  {{"pricing", {{"low", price}, {"medium", price}, {"high", price}}},
                   {"budgets", json::array({{{"tenant", "*"}, {"period", "month"}, {"limitUSD", 1e9}}})}}}});
  const int port = moeserve::test_support::FreeLoopbackPort();
  const int deployments = (pods + 1) / 2;
  for (int d = 0; d < deployments; ++d)
    server.Create("moedeployments.moeserve.io",
                  {{"apiVersion", "moeserve.io/v1alpha1"},
                   {"kind", "MoEDeployment"},
                   {"metadata", {{"name", "m" + std::to_string(d)}, {"namespace", "bench"}}},
                   {"spec",
                    {{"image", "moeserve/moe-daemon:0.1.0"},
                     {"model", {{"uri", "s3://models/m/"}}},
                     {"replicas", 2},
                     {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 0}}},
                     {"quotaPolicyRef", {{"name", "bench"}}},
                     {"endpoint", {{"port", port}}}}}});
  op::KubeConfig kc;
  kc.server = server.url();
  auto client = op::KubeClient::Create(kc);
  op::OperatorOptions o;
  o.webhook.addr = "0";
  o.usage_sync.interval = 1s;
  auto oper = std::make_unique<op::Operator>(**client, o);
  std::thread runner([&] { (void)oper->Run(); });
  std::vector<std::unique_ptr<daemon::Daemon>> daemons;
  for (int i = 0; i < pods; ++i) {
    const std::string md = "m" + std::to_string(i / 2), group = md + "-r" + std::to_string(i % 2);
    WaitFor([&] {
      return server.Get("statefulsets.apps", "bench", group) && server.Get("secrets", "bench", md + "-secrets") &&
             server.Get("configmaps", "bench", md + "-config");
    });
    auto sts = *server.Get("statefulsets.apps", "bench", group);
    json labels = sts["spec"]["template"]["metadata"]["labels"];
    const std::string ip = "127.0.1." + std::to_string(i + 2);
    server.Create("pods", {{"apiVersion", "v1"}, {"kind", "Pod"},
                           {"metadata", {{"name", group + "-0"}, {"namespace", "bench"}, {"labels", labels},
                                         {"ownerReferences", json::array({{{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"},
                                                                           {"name", group}, {"uid", sts["metadata"]["uid"]},
                                                                           {"controller", true}}})}}},
                           {"spec", {{"containers", json::array({{{"name", "d"}, {"image", "x"}}})}}}});
    server.Mutate("pods", "bench", group + "-0", [&](json& p) { p["status"] = {{"podIP", ip}}; }, true);
    const fs::path pod_dir = dir / (std::to_string(pods) + "-" + group);
    fs::create_directories(pod_dir);
    auto secret = *server.Get("secrets", "bench", md + "-secrets");
    std::ofstream(pod_dir / "api-keys.yaml") << Base64Decode(secret["data"]["api-keys.yaml"].get<std::string>());
    auto cm = *server.Get("configmaps", "bench", md + "-config");
    auto config = daemon::ParseDaemonConfigYaml(cm["data"]["config.yaml"].get<std::string>(), "config.yaml");
    if (!config) {
      std::fprintf(stderr, "%s\n", config.error().ToString().c_str());
      return {};
    }
    config->host = ip;
    config->api_keys_file = (pod_dir / "api-keys.yaml").string();
    config->metrics_token_file.clear();
    config->global_spend_file.clear();
    config->ledger_path = (pod_dir / "usage.sqlite3").string();
    {
      daemon::UsageLedger::Options lo;
      lo.path = config->ledger_path;
      lo.policy = config->budget;
      auto ledger = daemon::UsageLedger::Open(lo);
      for (int t = 0; t < tenants; ++t)
        for (const char* tier : {"low", "medium", "high"})
          (void)(*ledger)->ChargeAndWait({"tenant-" + std::to_string(t), tier, {100, 20, 30, 40}});
    }
    auto d = daemon::Daemon::Create(*config);
    if (!d || !(*d)->Start()) {
      std::fprintf(stderr, "daemon %d did not start\n", i);
      return {};
    }
    daemons.push_back(std::move(*d));
  }
  // Warm-up: every pod read once.
  WaitFor([&] { return oper->usage_sync_stats().pods_read >= static_cast<uint64_t>(pods); });
  std::vector<double> ms;
  uint64_t seen = oper->usage_sync_stats().syncs;
  while (static_cast<int>(ms.size()) < syncs) {
    WaitFor([&] { return oper->usage_sync_stats().syncs > seen; }, 30s);
    auto s = oper->usage_sync_stats();
    seen = s.syncs;
    ms.push_back(s.last_sync_seconds * 1000);
  }
  size_t bytes = 0;
  if (auto cm = server.Get("configmaps", "moeserve-system", op::BudgetRecordName("bench", "bench")))
    for (const auto& [k, v] : (*cm)["data"].items()) bytes += k.size() + v.get<std::string>().size();
  std::printf("pods %3d  budget record %zu bytes\n", pods, bytes);
  oper->RequestStop();
  runner.join();
  for (auto& d : daemons) d->Shutdown(0);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {4, 16, 64};
  int tenants = 20, syncs = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--pods") {
      sizes.clear();
      std::stringstream ss(v);
      for (std::string n; std::getline(ss, n, ',');) sizes.push_back(std::stoi(n));
    } else if (a == "--tenants") tenants = std::stoi(v);
    else if (a == "--syncs") syncs = std::stoi(v);
  }
  const fs::path dir = fs::temp_directory_path() / ("bench_usage_sync_" + std::to_string(::getpid()));
  for (int n : sizes) {
    auto ms = Run(n, tenants, syncs, dir);
    if (ms.empty()) return 1;
    std::sort(ms.begin(), ms.end());
    std::printf("pods %3d  tenants %d x 3 tiers  sync min %.1f ms  median %.1f ms  max %.1f ms (%zu syncs)\n", n, tenants,
                ms.front(), ms[ms.size() / 2], ms.back(), ms.size());
  }
  fs::remove_all(dir);
  return 0;
}

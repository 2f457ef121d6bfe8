// bench_operator_scale: N MoEDeployments (default 1,000) applied to the
// Kubernetes API double at once, with moe-operator running as its own
// process. Reports the time until every one is reconciled (children created,
// status written for its generation), the time until every one is Ready
// once all StatefulSets are marked ready, and the operator's peak RSS.
//
//   bench_operator_scale [--count N] [--workers W] [--appliers A]
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "fake_apiserver.hpp"
#include "moeserve/operator/kube_client.hpp"

extern char** environ;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

json Manifest(int i) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", "md-" + std::to_string(i)}, {"namespace", "bench"}}},
          {"spec",
           {{"image", "moeserve/moe-daemon:0.1.0"},
            {"model", {{"uri", "s3://models/m/"}, {"revision", "r1"}}},
            {"parallelism", {{"nodesPerReplica", 2}, {"gpusPerNode", 8}}},
            {"replicas", 1}}}};
}

int CountWhere(moeserve::fakes::FakeApiServer& server, const std::function<bool(const json&)>& pred) {
  return static_cast<int>(server.Count("moedeployments.moeserve.io", "bench", pred));
}

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

}  // namespace

int main(int argc, char** argv) {
  int count = 1000, workers = 4, appliers = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--count") count = std::stoi(argv[i + 1]);
    else if (a == "--workers") workers = std::stoi(argv[i + 1]);
    else if (a == "--appliers") appliers = std::stoi(argv[i + 1]);
  }
  moeserve::fakes::FakeApiServer server;
  for (const char* f : {"/crds/moeserve.io_moedeployments.yaml", "/crds/moeserve.io_quotapolicies.yaml"})
    if (!server.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR) + f)) return 1;
  if (server.Start(0) < 0) return 1;
  (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "bench"}}}});
  const std::string kubeconfig = (std::filesystem::temp_directory_path() / "moe-bench-kubeconfig.yaml").string();
  (void)server.WriteKubeconfig(kubeconfig, "bench");

  std::vector<std::string> args = {MOE_OPERATOR_BINARY, "--kubeconfig", kubeconfig, "--namespace", "bench",
                                   "--metrics-addr", "0", "--health-addr", "0", "--webhook-addr", "0",
                                   "--workers", std::to_string(workers)};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, cargs[0], nullptr, nullptr, cargs.data(), environ) != 0) {
    std::cerr << "cannot start " << MOE_OPERATOR_BINARY << "\n";
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // caches synced on an empty namespace

  // Apply every MoEDeployment at once, over HTTP, from several clients (as kubectl apply would).
  moeserve::op::KubeConfig config;
  config.server = server.url();
  auto client = moeserve::op::KubeClient::Create(config);
  const auto start = Clock::now();
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < appliers; ++t)
    threads.emplace_back([&] {
      for (int i = next++; i < count; i = next++)
        if (!(*client)->Create(moeserve::op::resources::kMoEDeployment, "bench", Manifest(i))) failed++;
    });
  for (auto& t : threads) t.join();
  const double applied_s = Seconds(start);

  auto reconciled = [](const json& md) {
    return md.contains("status") && md["status"].value("observedGeneration", 0) == md["metadata"].value("generation", -1) &&
           !md["status"].value("phase", "").empty();
  };
  while (CountWhere(server, reconciled) < count && Seconds(start) < 600)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double reconciled_s = Seconds(start);
  const int reconciled_n = CountWhere(server, reconciled);

  // Now every StatefulSet becomes ready, as the kubelet would report it.
  const auto ready_start = Clock::now();
  for (const auto& sts : server.List("statefulsets.apps", "bench")) {
    const int64_t gen = sts["metadata"].value("generation", int64_t{1});
    const int want = sts["spec"].value("replicas", 1);
    (void)server.Mutate("statefulsets.apps", "bench", sts["metadata"]["name"], [&](json& o) {
      o["status"] = {{"observedGeneration", gen}, {"replicas", want}, {"readyReplicas", want},
                     {"updatedReplicas", want}, {"currentRevision", "r"}, {"updateRevision", "r"}};
    }, true);
  }
  auto ready = [](const json& md) { return md.contains("status") && md["status"].value("phase", "") == "Ready"; };
  while (CountWhere(server, ready) < count && Seconds(ready_start) < 600)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double ready_s = Seconds(ready_start);
  const int ready_n = CountWhere(server, ready);

  kill(pid, SIGTERM);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  size_t writes = server.Writes().size();
  server.Stop();
  std::filesystem::remove(kubeconfig);

  printf("{\"moedeployments\": %d, \"create_failures\": %d, \"operator_workers\": %d,\n", count, failed.load(), workers);
  printf(" \"apply_seconds\": %.2f,\n", applied_s);
  printf(" \"all_reconciled_seconds\": %.2f, \"reconciled\": %d,\n", reconciled_s, reconciled_n);
  printf(" \"all_ready_after_statefulsets_ready_seconds\": %.2f, \"ready\": %d,\n", ready_s, ready_n);
  printf(" \"api_writes\": %zu,\n", writes);
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  auto cpu = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  printf(" \"api_double_cpu_seconds\": %.2f,\n", cpu(self));
  printf(" \"operator_peak_rss_mib\": %.1f, \"operator_cpu_seconds\": %.2f}\n", usage.ru_maxrss / 1024.0, cpu(usage));
  return reconciled_n == count && ready_n == count ? 0 : 1;
}

// bench_quota_webhook: the quota webhook's latency as the API server sees
// it. An in-process operator serves the webhook; the API double's webhook
// caller (tests/fakes/admission) sends it AdmissionReviews over HTTPS (a
// new TLS connection per call, as the double makes them), for a namespace
// with a QuotaPolicy and N MoEDeployments. Each review reads the namespace
// live (two list calls to the double). Prints p50, p99 and max over the
// calls, for reviews that are admitted and reviews that are refused.
//
//   bench_quota_webhook [--calls 1000] [--deployments 50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fake_apiserver.hpp"
#include "moeserve/operator/operator.hpp"

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

json Deployment(const std::string& name, int replicas) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", name}, {"namespace", "bench"}}},
          {"spec",
           {{"image", "moeserve/moe-daemon:0.1.0"},
            {"model", {{"uri", "s3://models/m/"}}},
            {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 8}}},
            {"replicas", replicas},
            {"quotaPolicyRef", {{"name", "bench"}}}}}};
}

void Report(const char* what, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))]; };
  std::printf("%-9s calls %zu  p50 %.2f ms  p99 %.2f ms  max %.2f ms\n", what, ms.size(), at(0.5), at(0.99),
              ms.back());
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 1000, deployments = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--calls") calls = std::stoi(argv[i + 1]);
    else if (a == "--deployments") deployments = std::stoi(argv[i + 1]);
  }
  moeserve::fakes::FakeApiServer server;
  for (const char* f : {"/crds/moeserve.io_moedeployments.yaml", "/crds/moeserve.io_quotapolicies.yaml"})
    if (!server.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR) + f)) return 1;
  if (server.Start(0) <= 0) return 1;
  for (const char* ns : {"bench", "moeserve-system"})
    (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  (void)server.Create("quotapolicies.moeserve.io", {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "QuotaPolicy"},
                                                    {"metadata", {{"name", "bench"}, {"namespace", "bench"}}},
                                                    {"spec", {{"limits", {{"maxGPUs", 8 * (deployments + 1)}}}}}});
  for (int i = 0; i < deployments; ++i) (void)server.Create("moedeployments.moeserve.io", Deployment("md-" + std::to_string(i), 1));

  moeserve::op::KubeConfig config;
  config.server = server.url();
  auto client = moeserve::op::KubeClient::Create(config);
  if (!client) return 1;
  moeserve::op::OperatorOptions options;
  options.workers = 1;
  options.webhook.addr = "127.0.0.1:0";
  options.webhook.operator_namespace = "moeserve-system";
  options.webhook.check_interval = std::chrono::milliseconds(200);
  moeserve::op::Operator op(**client, options);
  std::thread runner([&] { (void)op.Run(); });
  const auto started = Clock::now();
  while ((!op.quota().webhook() || op.quota().webhook()->ServedCertificate().empty()) &&
         Clock::now() - started < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!op.quota().webhook() || op.quota().webhook()->ServedCertificate().empty()) {
    std::fprintf(stderr, "the webhook never served\n");
    op.RequestStop();
    runner.join();
    return 1;
  }
  server.admission().MapService("moeserve-system", "moeserve-webhook", {op.quota().webhook()->port()});
  auto secret = server.Get("secrets", "moeserve-system", "moeserve-webhook-tls");
  const std::string ca = (*secret)["data"]["ca.crt"];
  const json configuration = {
      {"metadata", {{"name", "moeserve-quota"}}},
      {"webhooks",
       {{{"name", "quota.moeserve.io"},
         {"clientConfig",
          {{"caBundle", ca},
           {"service", {{"namespace", "moeserve-system"}, {"name", "moeserve-webhook"},
                        {"path", "/validate-moeserve-io-v1alpha1-moedeployment"}, {"port", 443}}}}},
         {"rules", {{{"apiGroups", {"moeserve.io"}}, {"apiVersions", {"v1alpha1"}},
                     {"resources", {"moedeployments"}}, {"operations", {"CREATE"}}}}},
         {"failurePolicy", "Fail"}}}}};

  std::vector<double> admitted, refused;
  int wrong = 0;
  for (int i = 0; i < calls; ++i) {
    const bool too_big = i % 2 == 1;
    moeserve::fakes::AdmissionAttributes a;
    a.group = a.kind_group = "moeserve.io";
    a.version = a.kind_version = "v1alpha1";
    a.resource = "moedeployments";
    a.kind = "MoEDeployment";
    a.operation = "CREATE";
    a.ns = "bench";
    a.name = "new";
    a.object = Deployment("new", too_big ? 2 : 1);
    const auto t0 = Clock::now();
    const auto verdict = server.admission().Admit({configuration}, a);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (verdict.allowed == too_big || (!verdict.allowed && verdict.code != 403)) wrong++;
    (too_big ? refused : admitted).push_back(ms);
  }
  std::printf("quota webhook, %d MoEDeployments in the namespace, a new TLS connection per call\n", deployments);
  Report("admitted", admitted);
  Report("refused", refused);
  if (wrong) std::printf("WRONG verdicts: %d\n", wrong);
  op.RequestStop();
  runner.join();
  return wrong ? 1 : 0;
}

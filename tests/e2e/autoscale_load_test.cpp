// e2e.autoscale_load: a MoEDeployment with spec.autoscaling (1 to 3 replica
// groups, 1 waiting request per group as the target) under a QuotaPolicy
// that allows 2 groups; the operator (autoscaler every 300 ms) and its quota
// webhook against the Kubernetes API double; real daemons serving the tiny
// model on 127.0.0.2-4, started by the test as the kubelet would start each
// group's pod (the operator's config.yaml, parsed by the daemon's own
// parser, the Secret's keys and metrics token). bench/load's generator
// ramps concurrent chat completions over the replicas the Service would
// route to:
//  - under the ramp the autoscaler asks for 3 groups, the quota webhook
//    refuses that step and admits 2 (Autoscaling=False, QuotaRefused, an
//    Event), the reconciler adds the group and the load spreads;
//  - after the ramp a trickle goes on; the autoscaler scales back to 1 after
//    its down delay; the removed group's daemon drains as on SIGTERM (out of
//    the Service first, requests in flight finish) and not one request of
//    either load fails.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "../daemon/daemon_harness.hpp"
#include "../operator/quota_webhook_support.hpp"
#include "chat_load.hpp"
#include "fake_apiserver.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "moeserve/operator/operator.hpp"

namespace moeserve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr char kNs[] = "team-a";
constexpr char kName[] = "chat";
constexpr char kMd[] = "moedeployments.moeserve.io";

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 60s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

json Deployment(int port) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", kName}, {"namespace", kNs}}},
          {"spec",
           {{"image", "moeserve/moe-daemon:0.1.0"},
            {"model", {{"uri", "s3://models/tiny/"}}},
            {"replicas", 1},
            {"parallelism", {{"nodesPerReplica", 1}, {"gpusPerNode", 0}}},
            {"quotaPolicyRef", {{"name", "team-a"}}},
            {"autoscaling",
             {{"minReplicas", 1},
              {"maxReplicas", 3},
              {"targets", {{"waitingRequestsPerReplica", 1}}},
              {"scaleUpStabilizationSeconds", 0},
              {"scaleDownDelaySeconds", 2}}},
            {"endpoint", {{"port", port}, {"apiKeys", {{"secretRef", {{"name", "keys"}}}}}}}}}};
}

class AutoscaleLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_moedeployments.yaml"));
    ASSERT_TRUE(server_.RegisterCrdFile(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/crds/moeserve.io_quotapolicies.yaml"));
    ASSERT_GT(server_.Start(0), 0);
    for (const char* ns : {kNs, "moeserve-system"})
      ASSERT_TRUE(server_.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}}));
    ASSERT_TRUE(server_.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                           {"metadata", {{"name", "keys"}, {"namespace", kNs},
                                                         {"labels", {{op::kUsableLabel, "true"}}}}},
                                           {"stringData", {{"acme", "sk-acme-1"}}}}));
    // Two replica groups at most.
    ASSERT_TRUE(server_.Create("quotapolicies.moeserve.io",
                               {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "QuotaPolicy"},
                                {"metadata", {{"name", "team-a"}, {"namespace", kNs}}},
                                {"spec", {{"limits", {{"maxGPUs", 8}, {"maxReplicas", 2}}}}}}));
    op::KubeConfig config;
    config.server = server_.url();
    auto client = op::KubeClient::Create(config);
    ASSERT_TRUE(client);
    client_ = std::move(*client);

    op::OperatorOptions o;
    o.workers = 2;
    o.webhook.addr = "127.0.0.1:0";
    o.webhook.operator_namespace = "moeserve-system";
    o.webhook.check_interval = 200ms;
    o.informer.watch_timeout_s = 5;
    o.informer.backoff_initial = 20ms;
    o.informer.backoff_max = 200ms;
    o.usage_sync.interval = 0ms;
    o.autoscaler.interval = 300ms;
    o.autoscaler.ttft_window_seconds = 5;
    operator_ = std::make_unique<op::Operator>(*client_, o);
    runner_ = std::thread([this] { (void)operator_->Run(); });
    ASSERT_TRUE(WaitFor([&] {
      auto* w = operator_->quota().webhook();
      return w && w->port() > 0 && !w->ServedCertificate().empty();
    }));
    server_.admission().MapService("moeserve-system", "moeserve-webhook", {operator_->quota().webhook()->port()});
    ASSERT_TRUE(server_.Create("validatingwebhookconfigurations.admissionregistration.k8s.io",
                               op::testing::QuotaWebhookConfiguration("Fail")));
    ASSERT_TRUE(WaitFor([&] {
      auto vwc = server_.Get("validatingwebhookconfigurations.admissionregistration.k8s.io", "", "moeserve-quota");
      return vwc && (*vwc)["webhooks"][0]["clientConfig"].contains("caBundle");
    })) << "the leader never wrote the CA bundle";

    port_ = test_support::FreeLoopbackPort();
    ASSERT_TRUE(server_.Create(kMd, Deployment(port_)));
    kubelet_ = std::thread([this] { Kubelet(); });
  }

  void TearDown() override {
    stop_kubelet_ = true;
    if (kubelet_.joinable()) kubelet_.join();
    if (operator_) operator_->RequestStop();
    if (runner_.joinable()) runner_.join();
    for (auto& t : drains_) t.join();
    std::lock_guard lock(mu_);
    for (auto& [group, d] : daemons_)
      if (d) d->Shutdown(1);
  }

  // The StatefulSet controller, kubelet and endpoints controller in one: a
  // group's StatefulSet that appears gets its rank-0 pod and a daemon on
  // 127.0.0.<2 + index>, ready, then in the Service; a StatefulSet that goes
  // away takes its pod out of the Service, then the daemon gets what SIGTERM
  // gives it (Shutdown: refuse new work, finish what is in flight).
  void Kubelet() {
    while (!stop_kubelet_) {
      for (int r = 0; r < 3; ++r) {
        const std::string group = std::string(kName) + "-r" + std::to_string(r);
        auto sts = server_.Get("statefulsets.apps", kNs, group);
        bool running;
        {
          std::lock_guard lock(mu_);
          running = daemons_.contains(group);
        }
        if (sts && !running) {
          auto d = StartGroup(*sts, group, r);
          std::lock_guard lock(mu_);
          if (d) ready_[group] = "http://127.0.0." + std::to_string(2 + r) + ":" + std::to_string(port_);
          max_groups_ = std::max<int>(max_groups_, static_cast<int>(daemons_.size()) + 1);
          daemons_[group] = std::move(d);
        } else if (!sts && running) {
          std::unique_ptr<daemon::Daemon> d;
          {
            std::lock_guard lock(mu_);
            ready_.erase(group);  // the endpoints controller drops the terminating pod
            d = std::move(daemons_[group]);
            daemons_.erase(group);
          }
          drained_groups_++;
          drains_.emplace_back([this, d = std::shared_ptr<daemon::Daemon>(std::move(d))] {
            std::this_thread::sleep_for(200ms);  // endpoint removal reaches the proxies
            if (d) {
              in_flight_at_drain_ += d->InFlight();
              d->Shutdown(10);
            }
          });
        }
      }
      std::this_thread::sleep_for(50ms);
    }
  }

  std::unique_ptr<daemon::Daemon> StartGroup(const json& sts, const std::string& group, int r) {
    const std::string pod_name = group + "-0", ip = "127.0.0." + std::to_string(2 + r);
    json labels = sts["spec"]["template"]["metadata"]["labels"];
    labels["apps.kubernetes.io/pod-index"] = "0";
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", pod_name},
                  {"namespace", kNs},
                  {"labels", labels},
                  {"ownerReferences", json::array({{{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"}, {"name", group},
                                                    {"uid", sts["metadata"]["uid"]}, {"controller", true}}})}}},
                {"spec", {{"containers", json::array({{{"name", "daemon"}, {"image", "moeserve/moe-daemon:0.1.0"}}})}}}};
    if (!server_.Create("pods", pod)) ADD_FAILURE() << "pod " << pod_name;
    server_.Mutate("pods", kNs, pod_name, [&](json& o) { o["status"] = {{"phase", "Running"}, {"podIP", ip}}; }, true);

    const fs::path dir = fs::path(::testing::TempDir()) / ("autoscale-" + pod_name + "-" + std::to_string(starts_++));
    fs::create_directories(dir);
    auto secret = server_.Get("secrets", kNs, std::string(kName) + "-secrets");
    auto cm = server_.Get("configmaps", kNs, std::string(kName) + "-config");
    if (!secret || !cm) {
      ADD_FAILURE() << "no Secret or ConfigMap for " << group;
      return nullptr;
    }
    std::ofstream(dir / "api-keys.yaml") << Base64Decode((*secret)["data"]["api-keys.yaml"].get<std::string>());
    std::ofstream(dir / "metrics-token") << Base64Decode((*secret)["data"][op::kMetricsTokenKey].get<std::string>());
    auto config = daemon::ParseDaemonConfigYaml((*cm)["data"]["config.yaml"].get<std::string>(), "config.yaml",
                                                daemon::testing::TestConfig());
    if (!config) {
      ADD_FAILURE() << config.error().ToString();
      return nullptr;
    }
    config->model = daemon::testing::TinyModelDir();
    config->host = ip;
    config->max_context = 4096;
    // Two sequences decode at once: a ramp of 8 clients keeps requests waiting.
    config->max_running = 2;
    config->api_keys_file = (dir / "api-keys.yaml").string();
    config->metrics_token_file = (dir / "metrics-token").string();
    config->global_spend_file = (dir / "spend.json").string();
    config->default_reasoning_effort = daemon::ReasoningEffort::kLow;
    return daemon::testing::StartDaemon(*config);
  }

  int SpecReplicas() {
    auto md = server_.Get(kMd, kNs, kName);
    return md ? (*md)["spec"].value("replicas", -1) : -1;
  }
  json Condition(const std::string& type) {
    auto md = server_.Get(kMd, kNs, kName);
    for (const auto& c : md ? md->value("status", json::object()).value("conditions", json::array()) : json::array())
      if (c.value("type", "") == type) return c;
    return json::object();
  }
  std::string PickEndpoint() {
    std::lock_guard lock(mu_);
    if (ready_.empty()) return "";
    auto it = ready_.begin();
    std::advance(it, next_++ % ready_.size());
    return it->second;
  }
  size_t EventsWithReason(const std::string& reason) {
    return server_.Count("events", kNs, [&](const json& e) { return e.value("reason", "") == reason; });
  }

  fakes::FakeApiServer server_;
  std::unique_ptr<op::KubeClient> client_;
  std::unique_ptr<op::Operator> operator_;
  std::thread runner_, kubelet_;
  std::atomic<bool> stop_kubelet_{false};
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<daemon::Daemon>> daemons_;
  std::map<std::string, std::string> ready_;  // group -> base URL, as the Service routes
  std::vector<std::thread> drains_;
  std::atomic<int> drained_groups_{0};
  std::atomic<size_t> in_flight_at_drain_{0};
  int max_groups_ = 0;
  int starts_ = 0;
  size_t next_ = 0;
  int port_ = 0;
};

TEST_F(AutoscaleLoad, ARampScalesUpToTheQuotaAndBackDownWithoutALostRequest) {
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard lock(mu_);
    return ready_.size() == 1;
  })) << "the first group never served";
  // Idle: the autoscaler looks and holds at the minimum.
  ASSERT_TRUE(WaitFor([&] { return operator_->autoscaler_stats().decisions >= 3; }));
  EXPECT_EQ(SpecReplicas(), 1);

  bench::ChatLoadOptions load;
  load.pick_endpoint = [&] { return PickEndpoint(); };
  load.api_key = "sk-acme-1";
  load.model = kName;  // the operator serves the model under the deployment's name
  load.max_tokens = 96;  // long enough that requests queue behind the two decoding
  load.start_concurrency = 2;
  load.peak_concurrency = 8;
  load.ramp_seconds = 1;
  load.hold_seconds = 30;  // ended below once the scale-up is seen
  std::atomic<bool> stop_ramp{false};
  bench::ChatLoadResult ramp;
  std::thread ramp_thread([&] { ramp = bench::RunChatLoad(load, &stop_ramp); });

  // Up: 3 is refused by the policy (2 groups at most), 2 is admitted and served.
  const bool scaled_up = WaitFor([&] { return SpecReplicas() == 2; }, 30s);
  const bool second_serves = scaled_up && WaitFor([&] {
    std::lock_guard lock(mu_);
    return ready_.size() == 2;
  }, 30s);
  json refusal;  // the condition as it was while the quota held the deployment back
  const bool refusal_shown = WaitFor([&] {
    refusal = Condition("Autoscaling");
    return refusal.value("reason", "") == "QuotaRefused";
  }, 10s);
  // Some load on both groups before the ramp ends.
  std::this_thread::sleep_for(1s);
  stop_ramp = true;
  ramp_thread.join();
  std::printf("ramp: %llu sent, %llu failed%s%s\n", static_cast<unsigned long long>(ramp.sent),
              static_cast<unsigned long long>(ramp.failed), ramp.failures.empty() ? "" : ": ",
              ramp.failures.empty() ? "" : ramp.failures[0].c_str());
  ASSERT_TRUE(scaled_up) << "spec.replicas never went to 2 under load; Autoscaling: " << Condition("Autoscaling").dump();
  ASSERT_TRUE(second_serves);
  EXPECT_TRUE(refusal_shown) << refusal.dump();
  EXPECT_EQ(refusal.value("status", ""), "False");
  EXPECT_NE(refusal.value("message", "").find("-> 3 replica groups was refused: admission webhook \"quota.moeserve.io\" "
                                              "denied the request: QuotaPolicy team-a: limits.maxReplicas is 2"),
            std::string::npos)
      << refusal.dump();
  EXPECT_GE(EventsWithReason("AutoscaledUp"), 1u);
  EXPECT_GE(EventsWithReason("AutoscaleRefused"), 1u);
  EXPECT_LE(max_groups_, 2) << "more groups ran than the quota allows";

  // Down: a trickle (no request waits) goes on while the autoscaler removes a group.
  load.start_concurrency = load.peak_concurrency = 2;
  load.ramp_seconds = 0;
  std::atomic<bool> stop_trickle{false};
  bench::ChatLoadResult trickle;
  std::thread trickle_thread([&] { trickle = bench::RunChatLoad(load, &stop_trickle); });
  const bool scaled_down = WaitFor([&] { return SpecReplicas() == 1 && drained_groups_ >= 1; }, 30s);
  // The drained daemon finished; a little more traffic on what is left.
  for (auto& t : drains_) t.join();
  drains_.clear();
  std::this_thread::sleep_for(500ms);
  stop_trickle = true;
  trickle_thread.join();
  ASSERT_TRUE(scaled_down) << "status: " << server_.Get(kMd, kNs, kName)->value("status", json::object()).dump();
  EXPECT_EQ(Condition("Autoscaling").value("status", ""), "True");
  EXPECT_GE(EventsWithReason("AutoscaledDown"), 1u);

  // Not one request failed, in the ramp or while the group drained.
  EXPECT_GE(ramp.sent, 8u);
  EXPECT_GE(trickle.sent, 4u);
  EXPECT_EQ(ramp.failed, 0u) << (ramp.failures.empty() ? "" : ramp.failures[0]);
  EXPECT_EQ(trickle.failed, 0u) << (trickle.failures.empty() ? "" : trickle.failures[0]);
  auto status = server_.Get(kMd, kNs, kName)->value("status", json::object());
  EXPECT_EQ(status["autoscaling"].value("currentReplicas", -1), 1) << status.dump();
  EXPECT_FALSE(status["autoscaling"].value("lastDecision", "").empty());
  const auto stats = operator_->autoscaler_stats();
  EXPECT_GE(stats.scale_ups, 1u);
  EXPECT_GE(stats.scale_downs, 1u);
  EXPECT_GE(stats.refusals, 1u);
  std::printf("ramp: %llu requests, trickle: %llu; in flight at the drain: %zu\n",
              static_cast<unsigned long long>(ramp.sent), static_cast<unsigned long long>(trickle.sent),
              in_flight_at_drain_.load());
}

}  // namespace
}  // namespace moeserve

// Shared pieces of the operator tests: the API double with our CRDs, a
// client for it, an operator running on a thread, and a stand-in for the
// kubelet and StatefulSet controller that marks StatefulSets ready.
#pragma once

#include <gtest/gtest.h>

#include <spawn.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "fake_apiserver.hpp"
#include "yaml_json.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/operator/kube_client.hpp"
#include "moeserve/operator/operator.hpp"

extern char** environ;

namespace moeserve::op::testing {

using nlohmann::json;
using namespace std::chrono_literals;

inline std::string SourceDir() {
  const char* d = std::getenv("MOESERVE_SOURCE_DIR");
  return d ? d : ".";
}

// The moe-operator binary of this build, for tests that run it as a process.
inline std::string OperatorBinary() {
  const char* d = std::getenv("MOESERVE_BINARY_DIR");
  return std::string(d ? d : ".") + "/operator/moe-operator";
}

// Starts args[0] with args, inheriting the environment; -1 when it cannot.
inline pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

inline bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 20s) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

inline json MoEDeploymentManifest(const std::string& ns, const std::string& name, int replicas, int nodes,
                                  const std::string& revision = "2026-11-01", int max_unavailable = 1) {
  return {{"apiVersion", "moeserve.io/v1alpha1"},
          {"kind", "MoEDeployment"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"image", "moeserve/moe-daemon:0.1.0"},
            {"model", {{"uri", "s3://models/ultra/"}, {"revision", revision}}},
            {"parallelism", {{"nodesPerReplica", nodes}, {"gpusPerNode", 8}}},
            {"replicas", replicas},
            {"endpoint", {{"port", 8000}}},
            {"rollout", {{"maxUnavailableReplicas", max_unavailable}}}}}};
}

// The API double with crds/ registered and a namespace to work in.
class FakeCluster {
 public:
  explicit FakeCluster(fakes::FakeApiServerOptions options = {}) : server(options) {
    for (const char* f : {"/crds/moeserve.io_moedeployments.yaml", "/crds/moeserve.io_quotapolicies.yaml"}) {
      auto s = server.RegisterCrdFile(SourceDir() + f);
      EXPECT_TRUE(s) << s.error().ToString();
    }
    EXPECT_GT(server.Start(0), 0);
    // The tenant's namespace, and the operator's own (admin keys, budget records).
    for (const char* ns : {"team-a", "moeserve-system"})
      (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }
  std::unique_ptr<KubeClient> Client(const std::string& user_agent = "moe-operator/test") {
    KubeConfig c;
    c.server = server.url();
    c.token = "test-token";
    c.user_agent = user_agent;
    c.request_timeout_s = 10;
    auto client = KubeClient::Create(c);
    EXPECT_TRUE(client);
    return std::move(*client);
  }
  fakes::FakeApiServer server;
};

// The operator's admin key for deployment ns/name, from its Secret in the
// operator's namespace; "" when there is none.
inline std::string AdminKeyOf(fakes::FakeApiServer& server, const std::string& ns, const std::string& name,
                              const std::string& operator_namespace = "moeserve-system") {
  auto secret = server.Get("secrets", operator_namespace, "moeserve-admin." + ns + "." + name);
  if (!secret || !(*secret)["data"].contains("admin-key")) return "";
  return Base64Decode((*secret)["data"]["admin-key"].get<std::string>());
}

// An operator on its own thread.
class RunningOperator {
 public:
  RunningOperator(KubeClient& client, OperatorOptions options) : op(client, WithTestTimings(std::move(options))) {
    thread = std::thread([this] { status = op.Run(); });
  }
  ~RunningOperator() { Stop(); }
  void Stop() {
    op.RequestStop();
    if (thread.joinable()) thread.join();
  }
  static OperatorOptions WithTestTimings(OperatorOptions o) {
    o.informer.watch_timeout_s = 5;
    o.informer.backoff_initial = 20ms;
    o.informer.backoff_max = 200ms;
    return o;
  }
  Operator op;
  std::thread thread;
  Status status;
};

// Plays the StatefulSet controller and kubelet: a StatefulSet whose
// generation moved has its pods restarted (unready), and after `delay` they
// are ready on the new revision. Records the most groups of one
// MoEDeployment ever unready at once.
class Kubelet {
 public:
  Kubelet(fakes::FakeApiServer& server, std::chrono::milliseconds delay) : server_(server), delay_(delay) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Kubelet() {
    stop_ = true;
    thread_.join();
  }
  int max_unready() const { return max_unready_; }
  void reset_max() { max_unready_ = 0; }
  void set_paused(bool p) { paused_ = p; }

 private:
  static bool Unready(const json& sts) {
    const json st = sts.value("status", json::object());
    return st.value("observedGeneration", int64_t{0}) != sts["metadata"].value("generation", int64_t{0}) ||
           st.value("readyReplicas", 0) < sts["spec"].value("replicas", 1) ||
           st.value("updatedReplicas", 0) < sts["spec"].value("replicas", 1);
  }
  void Loop() {
    while (!stop_) {
      std::map<std::string, int> unready_per_owner;
      for (const auto& sts : server_.List("statefulsets.apps")) {
        const std::string owner = sts["metadata"]["labels"].value("app.kubernetes.io/instance", "");
        if (Unready(sts)) unready_per_owner[owner]++;
        if (paused_) continue;
        const std::string key = sts["metadata"]["namespace"].get<std::string>() + "/" + sts["metadata"]["name"].get<std::string>();
        const int64_t gen = sts["metadata"].value("generation", int64_t{0});
        const int want = sts["spec"].value("replicas", 1);
        const json st = sts.value("status", json::object());
        if (st.value("observedGeneration", int64_t{0}) != gen) {
          restarted_[key] = std::chrono::steady_clock::now();
          (void)server_.Mutate("statefulsets.apps", sts["metadata"]["namespace"], sts["metadata"]["name"],
                               [&](json& o) {
                                 o["status"] = {{"observedGeneration", gen}, {"replicas", want}, {"readyReplicas", 0},
                                                {"updatedReplicas", 0}, {"currentRevision", "rev-" + std::to_string(gen - 1)},
                                                {"updateRevision", "rev-" + std::to_string(gen)}};
                               }, true);
        } else if (Unready(sts) && std::chrono::steady_clock::now() - restarted_[key] >= delay_) {
          (void)server_.Mutate("statefulsets.apps", sts["metadata"]["namespace"], sts["metadata"]["name"],
                               [&](json& o) {
                                 o["status"] = {{"observedGeneration", gen}, {"replicas", want}, {"readyReplicas", want},
                                                {"updatedReplicas", want}, {"availableReplicas", want},
                                                {"currentRevision", "rev-" + std::to_string(gen)},
                                                {"updateRevision", "rev-" + std::to_string(gen)}};
                               }, true);
        }
      }
      for (const auto& [owner, n] : unready_per_owner) max_unready_ = std::max(max_unready_.load(), n);
      std::this_thread::sleep_for(5ms);
    }
  }
  fakes::FakeApiServer& server_;
  std::chrono::milliseconds delay_;
  std::atomic<bool> stop_{false}, paused_{false};
  std::atomic<int> max_unready_{0};
  std::map<std::string, std::chrono::steady_clock::time_point> restarted_;
  std::thread thread_;
};

struct CommandResult {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult RunShell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

inline bool HaveKubectl() { return RunShell("kubectl version --client").rc == 0; }

// The real kubectl against the API double, as a tenant would use it.
class Kubectl {
 public:
  explicit Kubectl(fakes::FakeApiServer& server)
      : dir_(std::filesystem::temp_directory_path() /
             ("moe-kubectl-" + std::to_string(getpid()) + "-" + std::to_string(counter_++))) {
    std::filesystem::create_directories(dir_);
    EXPECT_TRUE(server.WriteKubeconfig((dir_ / "kubeconfig").string()));
  }
  ~Kubectl() { std::filesystem::remove_all(dir_); }
  CommandResult operator()(const std::string& args) const {
    return RunShell("kubectl --kubeconfig " + (dir_ / "kubeconfig").string() + " --cache-dir " +
                    (dir_ / "cache").string() + " --request-timeout=20s " + args);
  }
  // Writes `yaml` to a file and applies it.
  CommandResult Apply(const std::string& name, const std::string& yaml) const {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << yaml;
    return (*this)("apply -f " + path);
  }

 private:
  static inline std::atomic<int> counter_{0};
  std::filesystem::path dir_;
};

inline json ConditionOf(fakes::FakeApiServer& server, const std::string& ns, const std::string& name,
                        const std::string& type);

inline json StatusOf(fakes::FakeApiServer& server, const std::string& ns, const std::string& name) {
  auto md = server.Get("moedeployments.moeserve.io", ns, name);
  return md ? md->value("status", json::object()) : json::object();
}

inline json ConditionOf(fakes::FakeApiServer& server, const std::string& ns, const std::string& name,
                        const std::string& type) {
  for (const auto& c : StatusOf(server, ns, name).value("conditions", json::array()))
    if (c.value("type", "") == type) return c;
  return json::object();  // none yet
}

// A MoEDeployment stored with spec.<block>.<key>, a field the schema does not
// have (an object stored before the schema dropped it, or written around the
// API server's validation), and the operator run over it until the object's
// phase is Failed. Returns its Ready condition (empty when it never failed);
// `server` is left running so the caller can check what was not created.
inline json ReconcileUnknownSpecField(fakes::FakeApiServer& server, const std::string& block, const std::string& key,
                                      const json& block_value) {
  auto docs = fakes::LoadYamlFile(SourceDir() + "/crds/moeserve.io_moedeployments.yaml");
  EXPECT_TRUE(docs);
  if (!docs) return json::object();
  json crd = (*docs)[0];
  crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][block]["properties"][key] =
      {{"type", "string"}};
  EXPECT_TRUE(server.RegisterCrd(crd));
  // The operator reads QuotaPolicies too (its caches sync before it works).
  EXPECT_TRUE(server.RegisterCrdFile(SourceDir() + "/crds/moeserve.io_quotapolicies.yaml"));
  EXPECT_GT(server.Start(0), 0);
  EXPECT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-a"}}}}));
  json manifest = MoEDeploymentManifest("team-a", "root", 1, 1);
  manifest["spec"][block] = block_value;
  auto stored = server.Create("moedeployments.moeserve.io", manifest);
  EXPECT_TRUE(stored) << stored.error().ToString();
  if (!stored) return json::object();
  EXPECT_EQ((*stored)["spec"][block][key], block_value[key]) << "the API double dropped the field";
  KubeConfig config;
  config.server = server.url();
  config.request_timeout_s = 5;
  auto client = KubeClient::Create(config);
  EXPECT_TRUE(client);
  if (!client) return json::object();
  RunningOperator running(**client, {});
  const bool failed = WaitFor([&] { return StatusOf(server, "team-a", "root").value("phase", "") == "Failed"; });
  EXPECT_TRUE(failed) << StatusOf(server, "team-a", "root").dump(2);
  // What a reconcile that went on would have created has had time to appear.
  std::this_thread::sleep_for(300ms);
  return failed ? ConditionOf(server, "team-a", "root", "Ready") : json::object();
}

}  // namespace moeserve::op::testing

// The API double's pod runner (tests/fakes/pod_runner.hpp): a StatefulSet's
// pod runs as a local process from its own command, env, ConfigMap, Secret
// and emptyDir volumes, with mount paths under the pod's rootfs; it restarts
// on exit and stops on deletion; `kubectl logs` reads its output; what the
// runner cannot honour is refused with a reason and never run; a volume path
// that leaves its volume is refused and nothing is written outside the root.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "moeserve/common/base64.hpp"
#include "operator_test_util.hpp"
#include "pod_runner.hpp"

namespace moeserve::op::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class PodRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(server_.Start(0), 0);
    root_ = (fs::path(::testing::TempDir()) / ("pod-runner-" + std::to_string(getpid()))).string();
    fs::remove_all(root_);
    fakes::PodRunnerOptions options;
    options.root = root_ + "/root";
    options.images = {{"registry.example/shell", "/bin/sh"}};
    options.tick = std::chrono::milliseconds(50);
    options.max_grace_seconds = 2;
    runner_ = std::make_unique<fakes::PodRunner>(server_, options);
    ASSERT_TRUE(runner_->Start());
    ASSERT_TRUE(server_.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "t"}}}}));
  }
  void TearDown() override {
    if (runner_) runner_->Stop();
    fs::remove_all(root_);
  }

  // A StatefulSet of one pod running `script` in the shell image.
  void CreateStatefulSet(const std::string& name, const std::string& script, json pod_spec_extra = json::object(),
                         json container_extra = json::object()) {
    json container = {{"name", "main"}, {"image", "registry.example/shell:1"}, {"command", {"sh", "-c", script}}};
    container.merge_patch(container_extra);
    json pod_spec = {{"containers", json::array({container})}};
    pod_spec.merge_patch(pod_spec_extra);
    json sts = {{"apiVersion", "apps/v1"},
                {"kind", "StatefulSet"},
                {"metadata", {{"name", name}, {"namespace", "t"}}},
                {"spec",
                 {{"replicas", 1},
                  {"serviceName", name},
                  {"selector", {{"matchLabels", {{"app", name}}}}},
                  {"template", {{"metadata", {{"labels", {{"app", name}}}}}, {"spec", pod_spec}}}}}};
    ASSERT_TRUE(server_.Create("statefulsets.apps", sts));
  }
  json Pod(const std::string& name) {
    auto p = server_.Get("pods", "t", name);
    return p ? *p : json::object();
  }
  json MainState(const std::string& pod) {
    const json cs = Pod(pod).value("status", json::object()).value("containerStatuses", json::array());
    return cs.empty() ? json::object() : cs[0];
  }

  fakes::FakeApiServer server_;
  std::string root_;
  std::unique_ptr<fakes::PodRunner> runner_;
};

TEST_F(PodRunnerTest, RunsThePodsOwnCommandWithItsFilesAndEnv) {
  ASSERT_TRUE(server_.Create("configmaps", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                            {"metadata", {{"name", "conf"}, {"namespace", "t"}}},
                                            {"data", {{"app.conf", "secrets: /etc/app/secret/token\n"}}}}));
  ASSERT_TRUE(server_.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                         {"metadata", {{"name", "sec"}, {"namespace", "t"}}},
                                         {"data", {{"token", Base64Encode("s3cret")}}}}));
  // The script reads its files at the paths its spec names and writes to its emptyDir.
  CreateStatefulSet("web",
                    "cat /etc/app/config/app.conf > /data/seen; cat /etc/app/secret/token >> /data/seen; "
                    "echo \"index=$INDEX greeting=$GREETING\"; exec sleep 60",
                    {{"volumes", json::array({{{"name", "config"}, {"configMap", {{"name", "conf"}}}},
                                              {{"name", "secret"}, {"secret", {{"secretName", "sec"}}}},
                                              {{"name", "data"}, {"emptyDir", json::object()}}})}},
                    {{"env", json::array({{{"name", "GREETING"}, {"value", "hi"}},
                                          {{"name", "INDEX"},
                                           {"valueFrom", {{"fieldRef", {{"fieldPath",
                                                                          "metadata.labels['apps.kubernetes.io/pod-index']"}}}}}}})},
                     {"volumeMounts", json::array({{{"name", "config"}, {"mountPath", "/etc/app/config"}},
                                                   {{"name", "secret"}, {"mountPath", "/etc/app/secret"}},
                                                   {{"name", "data"}, {"mountPath", "/data"}}})}});
  ASSERT_TRUE(WaitFor([&] { return MainState("web-0").value("ready", false); }, std::chrono::seconds(20)))
      << Pod("web-0").dump(2);
  const fs::path rootfs = runner_->PodRootfs("t", "web-0");
  ASSERT_TRUE(WaitFor([&] { return fs::exists(rootfs / "data" / "seen") && fs::file_size(rootfs / "data" / "seen") > 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::ifstream in(rootfs / "data" / "seen");
  std::stringstream seen;
  seen << in.rdbuf();
  // The ConfigMap's path was rewritten under the rootfs; the Secret's bytes are as stored.
  EXPECT_EQ(seen.str(), "secrets: " + (rootfs / "etc/app/secret/token").string() + "\ns3cret");

  const json pod = Pod("web-0");
  EXPECT_EQ(pod["status"]["phase"], "Running");
  EXPECT_EQ(pod["status"]["podIP"], "127.0.0.1");
  EXPECT_EQ(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"], "0");
  ASSERT_TRUE(WaitFor([&] {
    auto sts = server_.Get("statefulsets.apps", "t", "web");
    return sts && (*sts)["status"].value("readyReplicas", 0) == 1;
  }));

  if (HaveKubectl()) {
    Kubectl kubectl(server_);
    ASSERT_TRUE(WaitFor([&] { return kubectl("logs web-0 -n t").output.find("index=0 greeting=hi") != std::string::npos; }))
        << kubectl("logs web-0 -n t").output;
    auto pods = kubectl("get pods -n t");
    EXPECT_NE(pods.output.find("1/1"), std::string::npos) << pods.output;
    EXPECT_NE(pods.output.find("Running"), std::string::npos) << pods.output;
  }

  // Deleted: its process is stopped (the pod's log gets no more lines, the sleep is gone).
  ASSERT_TRUE(server_.Delete("pods", "t", "web-0"));
  // The StatefulSet makes it again, as a new pod.
  ASSERT_TRUE(WaitFor([&] {
    const json again = Pod("web-0");
    return again.contains("metadata") && again["metadata"]["uid"] != pod["metadata"]["uid"] &&
           MainState("web-0").value("ready", false);
  }, std::chrono::seconds(20)));
}

TEST_F(PodRunnerTest, RestartsAnExitedContainerAndKeepsItsExitCode) {
  CreateStatefulSet("crash", "echo going; exit 3");
  ASSERT_TRUE(WaitFor([&] { return MainState("crash-0").value("restartCount", 0) >= 2; }, std::chrono::seconds(20)))
      << Pod("crash-0").dump(2);
  const json state = MainState("crash-0");
  EXPECT_EQ(state["lastState"]["terminated"]["exitCode"], 3);
  EXPECT_FALSE(state["ready"].get<bool>());
}

TEST_F(PodRunnerTest, InitContainersRunFirstAndInOrder) {
  json init = json::array({{{"name", "first"}, {"image", "registry.example/shell"}, {"command", {"sh", "-c", "echo one >> /work/order"}},
                            {"volumeMounts", json::array({{{"name", "w"}, {"mountPath", "/work"}}})}},
                           {{"name", "second"}, {"image", "registry.example/shell"}, {"command", {"sh", "-c", "echo two >> /work/order"}},
                            {"volumeMounts", json::array({{{"name", "w"}, {"mountPath", "/work"}}})}}});
  CreateStatefulSet("ordered", "echo main >> /work/order; exec sleep 60",
                    {{"initContainers", init}, {"volumes", json::array({{{"name", "w"}, {"emptyDir", json::object()}}})}},
                    {{"volumeMounts", json::array({{{"name", "w"}, {"mountPath", "/work"}}})}});
  ASSERT_TRUE(WaitFor([&] { return MainState("ordered-0").value("ready", false); }, std::chrono::seconds(20)));
  ASSERT_TRUE(WaitFor([&] {
    std::ifstream in(fs::path(runner_->PodRootfs("t", "ordered-0")) / "work" / "order");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str() == "one\ntwo\nmain\n";
  }));
}

// Refused, with the reason in the pod's status and an Event, and never run.
TEST_F(PodRunnerTest, RefusesWhatItCannotHonour) {
  struct Case {
    std::string name;
    json pod_spec, container;
    std::string reason, words;
  };
  const std::vector<Case> cases = {
      {"hostpath", {{"volumes", json::array({{{"name", "h"}, {"hostPath", {{"path", "/etc"}}}}})}},
       {{"volumeMounts", json::array({{{"name", "h"}, {"mountPath", "/host"}}})}}, "CreateContainerConfigError", "hostPath"},
      {"privileged", json::object(), {{"securityContext", {{"privileged", true}}}}, "CreateContainerConfigError", "privileged"},
      {"unknown-image", json::object(), {{"image", "registry.example/other:2"}}, "ErrImagePull", "registry.example/other:2"},
      {"other-program", json::object(), {{"command", {"python3", "-c", "print(1)"}}}, "CreateContainerConfigError",
       "names another program"},
  };
  for (const auto& c : cases) CreateStatefulSet(c.name, "touch /ran; exec sleep 60", c.pod_spec, c.container);
  CreateStatefulSet("gpu", "exec sleep 60", json::object(),
                    {{"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(WaitFor([&] { return MainState(c.name + "-0").contains("state"); })) << Pod(c.name + "-0").dump(2);
    const json waiting = MainState(c.name + "-0")["state"].value("waiting", json::object());
    EXPECT_EQ(waiting.value("reason", ""), c.reason);
    EXPECT_NE(waiting.value("message", "").find(c.words), std::string::npos) << waiting.dump();
    EXPECT_FALSE(fs::exists(fs::path(runner_->PodRootfs("t", c.name + "-0")) / "ran"));
  }
  ASSERT_TRUE(WaitFor([&] { return Pod("gpu-0").value("status", json::object()).contains("conditions"); }));
  const json scheduled = Pod("gpu-0")["status"]["conditions"][0];
  EXPECT_EQ(scheduled["type"], "PodScheduled");
  EXPECT_EQ(scheduled["status"], "False");
  EXPECT_NE(scheduled.value("message", "").find("Insufficient nvidia.com/gpu"), std::string::npos) << scheduled.dump();
  size_t warnings = server_.Count("events", "t", [](const json& e) { return e.value("type", "") == "Warning"; });
  EXPECT_GE(warnings, cases.size() + 1);
}

// A ConfigMap item or subPath that climbs out of its volume is refused;
// nothing lands outside the runner's root.
TEST_F(PodRunnerTest, NothingIsWrittenOutsideItsRoot) {
  ASSERT_TRUE(server_.Create("configmaps", {{"apiVersion", "v1"}, {"kind", "ConfigMap"},
                                            {"metadata", {{"name", "evil"}, {"namespace", "t"}}},
                                            {"data", {{"k", "escaped"}}}}));
  const std::string escape = "../../../../../../escaped-" + std::to_string(getpid());
  CreateStatefulSet("climb", "exec sleep 60",
                    {{"volumes", json::array({{{"name", "c"},
                                               {"configMap", {{"name", "evil"}, {"items", json::array({{{"key", "k"}, {"path", escape}}})}}}}})}},
                    {{"volumeMounts", json::array({{{"name", "c"}, {"mountPath", "/c"}}})}});
  ASSERT_TRUE(WaitFor([&] {
    const json s = MainState("climb-0");
    return s.contains("state") &&
           s["state"].value("waiting", json::object()).value("message", "").find("leaves the volume") != std::string::npos;
  })) << Pod("climb-0").dump(2);
  for (fs::path p = fs::path(root_) / "root" / "pods" / "t" / "climb-0" / "volumes" / "c"; p.has_parent_path() && p != p.parent_path();
       p = p.parent_path())
    EXPECT_FALSE(fs::exists(p / ("escaped-" + std::to_string(getpid())))) << p;
}

}  // namespace
}  // namespace moeserve::op::testing

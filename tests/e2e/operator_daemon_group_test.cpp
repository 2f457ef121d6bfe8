// The operator-to-daemon contract for a multi-node replica group: the
// operator (against the API double) renders a MoEDeployment with
// nodesPerReplica 2 and gpusPerNode 0; the daemon container's environment
// from that StatefulSet, with what Kubernetes itself fills in (each pod's
// ordinal and IP, the master's DNS name resolving to pod 0, the Secret
// mounted as files) and nothing else changed, starts two real moe-daemon
// processes that form the group: rank 0 becomes ready and serves.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "../daemon/daemon_harness.hpp"
#include "../operator/operator_test_util.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/operator/moedeployment.hpp"

extern char** environ;

namespace moeserve {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Environment for the daemon of pod `ordinal`, as the kubelet would build it.
std::vector<std::string> PodEnvironment(const json& container, int ordinal, const std::string& secrets_dir, int rdv_port,
                                        std::string* master_addr) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) out.emplace_back(*e);
  for (const auto& e : container["env"]) {
    const std::string name = e["name"];
    std::string value;
    if (e.contains("value")) {
      value = e["value"];
    } else {
      const std::string field = e["valueFrom"]["fieldRef"]["fieldPath"];
      if (field == "metadata.labels['apps.kubernetes.io/pod-index']") value = std::to_string(ordinal);
      else if (field == "status.podIP") value = "127.0.0.1";
      else ADD_FAILURE() << "unexpected fieldRef " << field << " for " << name;
    }
    if (name == "MOE_MASTER_ADDR") {
      *master_addr = value;
      value = "127.0.0.1";  // what cluster DNS answers for pod 0 here
    }
    if (name == "MOE_GROUP_SECRET_FILE" && value.starts_with(op::kSecretsDir))
      value = secrets_dir + value.substr(std::string(op::kSecretsDir).size());
    if (name == "MOE_RENDEZVOUS_PORT") {
      EXPECT_EQ(value, std::to_string(op::kRendezvousPort));
      value = std::to_string(rdv_port);  // a free port: tests may run side by side
    }
    if (name == "HOME") continue;
    out.push_back(name + "=" + value);
  }
  return out;
}

pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<char*> argv, envp;
  std::vector<std::string> a = args, e = env;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : e) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(argv[0], argv.data(), envp.data());
    std::_Exit(127);
  }
  return pid;
}

TEST(OperatorDaemonGroup, RenderedTwoNodePodsFormAGroupThatServes) {
  op::testing::FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  json manifest = op::testing::MoEDeploymentManifest("team-a", "ultra", 1, 2);
  manifest["spec"]["parallelism"]["gpusPerNode"] = 0;
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", manifest));
  json sts, secret;
  {
    op::testing::RunningOperator running(*client, op::OperatorOptions{});
    ASSERT_TRUE(op::testing::WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "ultra-r0").has_value(); }));
    ASSERT_TRUE(op::testing::WaitFor([&] { return server.Get("secrets", "team-a", "ultra-secrets").has_value(); }));
    sts = *server.Get("statefulsets.apps", "team-a", "ultra-r0");
    secret = *server.Get("secrets", "team-a", "ultra-secrets");
  }
  EXPECT_EQ(sts["spec"]["replicas"], 2);
  json container;
  for (const auto& c : sts["spec"]["template"]["spec"]["containers"])
    if (c["name"] == "moe-daemon") container = c;
  ASSERT_FALSE(container.is_null());

  const std::string dir = ::testing::TempDir() + "/moe_e2e_group_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/secrets");
  ASSERT_TRUE(secret["data"].contains(op::kGroupSecretKey));
  std::ofstream(dir + "/secrets/" + op::kGroupSecretKey) << Base64Decode(secret["data"][op::kGroupSecretKey].get<std::string>());

  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  const std::string exe = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/daemon/moe-daemon";
  const int rdv = test_support::FreeLoopbackPort();
  std::vector<int> ports = {test_support::FreeLoopbackPort(), test_support::FreeLoopbackPort()};
  std::vector<pid_t> pids;
  for (int ordinal = 0; ordinal < 2; ++ordinal) {
    std::string master;
    auto env = PodEnvironment(container, ordinal, dir + "/secrets", rdv, &master);
    EXPECT_EQ(master, "ultra-r0-0.ultra-r0");
    std::filesystem::create_directories(dir + "/r" + std::to_string(ordinal));
    pids.push_back(Spawn({exe, "serve", "--model", daemon::testing::TinyModelDir(), "--port", std::to_string(ports[ordinal]),
                          "--served-model-name", "tiny", "--max-context", "4096", "--threads", "1", "--ledger-path",
                          dir + "/r" + std::to_string(ordinal) + "/usage.sqlite3"},
                         env));
  }
  bool ready = false;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!ready && Clock::now() < deadline) {
    ready = daemon::testing::Http(ports[0], "GET", "/readyz").status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(ready) << "rank 0 never saw the group formed from the operator's environment";
  if (ready) {
    auto chat = daemon::testing::Chat(ports[0], {{"model", "tiny"},
                                                 {"messages", daemon::testing::UserTurn("hello")},
                                                 {"max_tokens", 8}});
    EXPECT_EQ(chat.status, 200) << chat.body;
    EXPECT_EQ(daemon::testing::Http(ports[1], "GET", "/readyz").status, 200);
  }
  for (pid_t p : pids) {
    ::kill(p, SIGTERM);
    ::waitpid(p, nullptr, 0);
  }
}

}  // namespace
}  // namespace moeserve

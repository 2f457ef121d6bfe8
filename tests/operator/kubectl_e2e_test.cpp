// The real kubectl against the API double: apply -k examples/, get with the
// CRD's printer columns, describe, delete, and an invalid MoEDeployment
// refused by the CRD schema with the apiserver's message.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fake_apiserver.hpp"

namespace {

using moeserve::fakes::FakeApiServer;

std::string SourceDir() {
  const char* d = std::getenv("MOESERVE_SOURCE_DIR");
  return d ? d : ".";
}

struct CommandResult {
  int rc;
  std::string output;
};

CommandResult RunShell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

class KubectlE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunShell("kubectl version --client").rc != 0) GTEST_SKIP() << "kubectl not installed";
    dir_ = std::filesystem::temp_directory_path() / ("moe-kubectl-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    ASSERT_GT(server_.Start(0), 0);
    kubeconfig_ = (dir_ / "kubeconfig").string();
    ASSERT_TRUE(server_.WriteKubeconfig(kubeconfig_));
  }
  void TearDown() override {
    server_.Stop();
    std::filesystem::remove_all(dir_);
  }
  CommandResult Kubectl(const std::string& args) {
    return RunShell("kubectl --kubeconfig " + kubeconfig_ + " --cache-dir " + (dir_ / "cache").string() +
               " --request-timeout=20s " + args);
  }
  FakeApiServer server_;
  std::filesystem::path dir_;
  std::string kubeconfig_;
};

TEST_F(KubectlE2E, ApplyGetDescribeDelete) {
  auto crds = Kubectl("apply -f " + SourceDir() + "/crds/");
  ASSERT_EQ(crds.rc, 0) << crds.output;
  EXPECT_NE(crds.output.find("moedeployments.moeserve.io created"), std::string::npos) << crds.output;

  auto apply = Kubectl("apply -k " + SourceDir() + "/examples/");
  ASSERT_EQ(apply.rc, 0) << apply.output;
  EXPECT_NE(apply.output.find("moedeployment.moeserve.io/ultra created"), std::string::npos) << apply.output;
  EXPECT_NE(apply.output.find("quotapolicy.moeserve.io/team-a created"), std::string::npos) << apply.output;

  // Defaults from the schema were applied by the server.
  auto stored = server_.Get("moedeployments.moeserve.io", "team-a", "ultra");
  ASSERT_TRUE(stored);
  EXPECT_EQ((*stored)["spec"]["engine"]["thinking"]["defaultTier"], "medium");
  EXPECT_EQ((*stored)["spec"]["vault"]["role"], "team-a");
  // The service account that logs in to Vault is platform configuration, not a field.
  EXPECT_FALSE((*stored)["spec"]["vault"].contains("serviceAccount"));

  // A second apply with nothing changed is unchanged.
  auto again = Kubectl("apply -k " + SourceDir() + "/examples/");
  ASSERT_EQ(again.rc, 0) << again.output;
  EXPECT_NE(again.output.find("moedeployment.moeserve.io/ultra unchanged"), std::string::npos) << again.output;

  // Status is only writable through the status subresource; set it as the operator would.
  ASSERT_TRUE(server_.Mutate("moedeployments.moeserve.io", "team-a", "ultra", [](nlohmann::json& o) {
    o["status"] = {{"phase", "Ready"}, {"ready", "2/2"}, {"endpoint", "http://ultra.team-a.svc:8000/v1"}};
  }, /*status=*/true));

  auto get = Kubectl("get moedeployments -n team-a");
  ASSERT_EQ(get.rc, 0) << get.output;
  for (const char* column : {"NAME", "PHASE", "READY", "REVISION", "ENDPOINT", "AGE"})
    EXPECT_NE(get.output.find(column), std::string::npos) << column << " missing in\n" << get.output;
  EXPECT_NE(get.output.find("ultra"), std::string::npos) << get.output;
  EXPECT_NE(get.output.find("2/2"), std::string::npos) << get.output;
  EXPECT_NE(get.output.find("2026-11-01"), std::string::npos) << get.output;
  EXPECT_NE(get.output.find("http://ultra.team-a.svc:8000/v1"), std::string::npos) << get.output;

  // get -w: Table rows streamed over the watch as the status changes.
  std::thread changer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    (void)server_.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                         [](nlohmann::json& o) { o["status"]["phase"] = "Degraded"; o["status"]["ready"] = "1/2"; }, true);
  });
  auto watched = Kubectl("get moedeployments -n team-a -w --request-timeout=4s");
  changer.join();
  EXPECT_NE(watched.output.find("Degraded"), std::string::npos) << watched.output;
  EXPECT_NE(watched.output.find("1/2"), std::string::npos) << watched.output;

  auto short_name = Kubectl("get moed ultra -n team-a -o jsonpath={.spec.model.revision}");
  ASSERT_EQ(short_name.rc, 0) << short_name.output;
  EXPECT_EQ(short_name.output, "2026-11-01");

  // An Event about it, as the operator records them; describe lists it.
  auto md = server_.Get("moedeployments.moeserve.io", "team-a", "ultra");
  ASSERT_TRUE(server_.Create("events", {{"apiVersion", "v1"}, {"kind", "Event"},
      {"metadata", {{"name", "ultra.1"}, {"namespace", "team-a"}}},
      {"involvedObject", {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "MoEDeployment"}, {"name", "ultra"},
                          {"namespace", "team-a"}, {"uid", (*md)["metadata"]["uid"]}}},
      {"type", "Normal"}, {"reason", "PhaseReady"}, {"message", "phase Pulling -> Ready"},
      {"source", {{"component", "moe-operator"}}}, {"count", 1},
      {"firstTimestamp", (*md)["metadata"]["creationTimestamp"]}, {"lastTimestamp", (*md)["metadata"]["creationTimestamp"]}}));

  // The scale subresource.
  auto scale = Kubectl("scale moedeployment ultra -n team-a --replicas=3");
  ASSERT_EQ(scale.rc, 0) << scale.output;
  EXPECT_EQ((*server_.Get("moedeployments.moeserve.io", "team-a", "ultra"))["spec"]["replicas"], 3);

  auto describe = Kubectl("describe moedeployment ultra -n team-a");
  EXPECT_NE(describe.output.find("PhaseReady"), std::string::npos) << describe.output;
  EXPECT_NE(describe.output.find("phase Pulling -> Ready"), std::string::npos) << describe.output;
  ASSERT_EQ(describe.rc, 0) << describe.output;
  EXPECT_NE(describe.output.find("Name:"), std::string::npos) << describe.output;
  EXPECT_NE(describe.output.find("s3://models/ultra-moe-2.8t/"), std::string::npos) << describe.output;

  auto del = Kubectl("delete -f " + SourceDir() + "/examples/moedeployment.yaml");
  ASSERT_EQ(del.rc, 0) << del.output;
  EXPECT_NE(del.output.find("moedeployment.moeserve.io \"ultra\" deleted"), std::string::npos) << del.output;
  EXPECT_FALSE(server_.Get("moedeployments.moeserve.io", "team-a", "ultra"));

  auto gone = Kubectl("get moedeployment ultra -n team-a");
  EXPECT_NE(gone.rc, 0);
  EXPECT_NE(gone.output.find("NotFound"), std::string::npos) << gone.output;
}

TEST_F(KubectlE2E, InvalidMoEDeploymentsAreRefusedBySchema) {
  ASSERT_EQ(Kubectl("apply -f " + SourceDir() + "/crds/").rc, 0);
  auto write = [&](const std::string& name, const std::string& body) {
    std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " << name
                        << "\n  namespace: default\nspec:\n" << body;
    return path;
  };
  const std::string ok_model = "  image: moeserve/moe-daemon:0.1.0\n  model: {uri: s3://models/m/}\n";

  auto negative = Kubectl("apply -f " + write("negative", ok_model + "  replicas: -1\n"));
  EXPECT_NE(negative.rc, 0);
  EXPECT_NE(negative.output.find("spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"),
            std::string::npos)
      << negative.output;

  auto tier = Kubectl("apply -f " + write("tier", ok_model + "  engine: {thinking: {defaultTier: extreme}}\n"));
  EXPECT_NE(tier.rc, 0);
  EXPECT_NE(tier.output.find("spec.engine.thinking.defaultTier: Unsupported value: \"extreme\""), std::string::npos)
      << tier.output;

  auto uri = Kubectl("apply -f " + write("uri", "  image: moeserve/moe-daemon:0.1.0\n  model: {uri: ftp://models/m}\n"));
  EXPECT_NE(uri.rc, 0);
  EXPECT_NE(uri.output.find("spec.model.uri: Invalid value: \"ftp://models/m\""), std::string::npos) << uri.output;

  auto missing = Kubectl("apply -f " + write("missing", "  replicas: 1\n"));
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.output.find("spec.image: Required value"), std::string::npos) << missing.output;

  auto unknown = Kubectl("apply -f " + write("unknown", ok_model + "  replicaz: 3\n"));
  EXPECT_NE(unknown.rc, 0);
  EXPECT_NE(unknown.output.find("unknown field \"spec.replicaz\""), std::string::npos) << unknown.output;

  EXPECT_TRUE(server_.List("moedeployments.moeserve.io").empty());
}

}  // namespace

// The ConfigMap the operator writes is moe-daemon's serve configuration: the
// daemon's own parser (which refuses unknown keys) must accept it and read
// the model source, revision, cache, endpoint and limits the spec asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <yaml-cpp/yaml.h>

#include "moeserve/daemon/config.hpp"
#include "moeserve/operator/moedeployment.hpp"

namespace moeserve {
namespace {

nlohmann::json ExampleDeployment() {
  std::ifstream in(std::string(MOESERVE_SOURCE_DIR_DEFAULT) + "/examples/moedeployment.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  // The example is YAML; convert through yaml-cpp to JSON.
  std::function<nlohmann::json(const YAML::Node&)> to_json = [&](const YAML::Node& n) -> nlohmann::json {
    if (n.IsMap()) {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
      return o;
    }
    if (n.IsSequence()) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : n) a.push_back(to_json(e));
      return a;
    }
    if (n.IsNull()) return nullptr;
    const std::string s = n.Scalar();
    if (n.Tag() == "!") return s;  // quoted: a string
    try {
      size_t used = 0;
      long long v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (...) {
    }
    if (s == "true" || s == "false") return s == "true";
    return s;
  };
  return to_json(YAML::Load(ss.str()));
}

TEST(OperatorDaemonContract, ConfigMapParsesAsDaemonConfig) {
  nlohmann::json md = ExampleDeployment();
  ASSERT_EQ(md["kind"], "MoEDeployment");
  auto spec = op::ParseMoEDeploymentSpec(md["spec"]);
  ASSERT_TRUE(spec) << spec.error().ToString();
  for (bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "tls" : "plain");
    op::MoEDeploymentSpec s = *spec;
    if (tls) s.tls_secret = "ultra-tls";
    nlohmann::json cm = op::desired::ConfigMap(md, s);
    const std::string text = cm["data"]["config.yaml"];
    auto cfg = daemon::ParseDaemonConfigYaml(text, "config.yaml");
    ASSERT_TRUE(cfg) << cfg.error().ToString() << "\n" << text;
    // The daemon serves the directory the init container pulled; it never pulls itself.
    EXPECT_EQ(cfg->model, op::desired::ModelDirectory(s));
    EXPECT_EQ(cfg->model.find("://"), std::string::npos);
    EXPECT_EQ(cfg->model_revision, s.model_revision);
    EXPECT_EQ(cfg->port, s.port);
    EXPECT_EQ(cfg->host, "0.0.0.0");
    EXPECT_EQ(cfg->served_model_name, md["metadata"]["name"]);
    // Keys always on, /metrics behind the token, never unauthenticated.
    EXPECT_EQ(cfg->api_keys_file, std::string(op::kSecretsDir) + "/api-keys.yaml");
    EXPECT_EQ(cfg->metrics_token_file, std::string(op::kSecretsDir) + "/metrics-token");
    EXPECT_FALSE(cfg->allow_unauthenticated);
    EXPECT_EQ(cfg->tls_cert_file, tls ? std::string(op::kSecretsDir) + "/tls.crt" : "");
    EXPECT_EQ(cfg->tls_key_file, tls ? std::string(op::kSecretsDir) + "/tls.key" : "");
  }
}

// Several replicas: each StatefulSet names its replica, and every replica's
// config lists all of them at their group's rank-0 pod, so that a session
// turn the Service sends anywhere reaches the replica that owns it.
TEST(OperatorDaemonContract, ReplicasKnowEachOtherForSessions) {
  nlohmann::json md = ExampleDeployment();
  auto spec = op::ParseMoEDeploymentSpec(md["spec"]);
  ASSERT_TRUE(spec) << spec.error().ToString();
  op::MoEDeploymentSpec s = *spec;
  s.replicas = 3;
  const std::string ns = md["metadata"].value("namespace", "default");
  const std::string name = md["metadata"]["name"];
  const std::string text = op::desired::ConfigMap(md, s)["data"]["config.yaml"];
  const std::string path = ::testing::TempDir() + "/replicas-config.yaml";
  std::ofstream(path) << text;
  for (int r = 0; r < s.replicas; ++r) {
    SCOPED_TRACE("replica " + std::to_string(r));
    nlohmann::json sts = op::desired::StatefulSet(md, s, r, "hash");
    std::vector<std::string> args;  // as moe-daemon hands them on: "serve" first
    for (const auto& a : sts["spec"]["template"]["spec"]["containers"][0]["args"]) args.push_back(a);
    auto config_flag = std::find(args.begin(), args.end(), "--config");
    ASSERT_NE(config_flag, args.end());
    *(config_flag + 1) = path;  // the mounted ConfigMap, here
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    auto cfg = daemon::ParseServeArgs(static_cast<int>(argv.size()), argv.data());
    ASSERT_TRUE(cfg) << cfg.error().ToString() << "\n" << text;
    EXPECT_EQ(cfg->sessions.replica, "r" + std::to_string(r));
    ASSERT_EQ(cfg->sessions.peers.size(), 3u);
    for (int peer = 0; peer < s.replicas; ++peer) {
      const std::string group = name + "-r" + std::to_string(peer);
      EXPECT_EQ(cfg->sessions.peers["r" + std::to_string(peer)],
                "http://" + group + "-0." + group + "." + ns + ".svc:" + std::to_string(s.port));
    }
  }
  s.replicas = 1;  // one replica owns every session: nothing to forward
  auto single = daemon::ParseDaemonConfigYaml(op::desired::ConfigMap(md, s)["data"]["config.yaml"], "config.yaml");
  ASSERT_TRUE(single) << single.error().ToString();
  EXPECT_TRUE(single->sessions.peers.empty());
}

// spec.prefixDisk: the daemon reads the tier's directory (the pod's
// emptyDir) and its byte and age bounds from the config the operator wrote.
TEST(OperatorDaemonContract, PrefixDiskReachesTheDaemon) {
  nlohmann::json md = ExampleDeployment();
  nlohmann::json spec_json = md["spec"];
  spec_json["prefixDisk"] = {{"sizeGi", 8}, {"maxAgeSeconds", 604800}};
  auto spec = op::ParseMoEDeploymentSpec(spec_json);
  ASSERT_TRUE(spec) << spec.error().ToString();
  const std::string text = op::desired::ConfigMap(md, *spec)["data"]["config.yaml"];
  auto cfg = daemon::ParseDaemonConfigYaml(text, "config.yaml");
  ASSERT_TRUE(cfg) << cfg.error().ToString() << "\n" << text;
  EXPECT_EQ(cfg->prefix_disk_dir, op::kPrefixDiskDir);
  EXPECT_EQ(cfg->prefix_disk_bytes, (int64_t{8} << 30) * 9 / 10);
  EXPECT_EQ(cfg->prefix_disk_max_age_seconds, 604800.0);
  auto off = daemon::ParseDaemonConfigYaml(op::desired::ConfigMap(md, *op::ParseMoEDeploymentSpec(md["spec"]))["data"]
                                                                 ["config.yaml"],
                                           "config.yaml");
  ASSERT_TRUE(off) << off.error().ToString();
  EXPECT_TRUE(off->prefix_disk_dir.empty());
}

}  // namespace
}  // namespace moeserve

// The ConfigMap the operator writes is moe-daemon's serve configuration: the
// daemon's own parser (which refuses unknown keys) must accept it and read
// the model source, revision, cache, endpoint and limits the spec asked for.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace moeserve

// Shared by the quota webhook tests: the ValidatingWebhookConfiguration the
// chart installs (quota.moeserve.io on moedeployments and their scale
// subresource), QuotaPolicy and MoEDeployment manifests as YAML for kubectl.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "fake_apiserver.hpp"

namespace moeserve::op::testing {

inline nlohmann::json QuotaWebhookConfiguration(const std::string& failure_policy, const std::string& ca_bundle = "") {
  nlohmann::json client_config = {{"service",
                                   {{"namespace", "moeserve-system"},
                                    {"name", "moeserve-webhook"},
                                    {"path", "/validate-moeserve-io-v1alpha1-moedeployment"},
                                    {"port", 443}}}};
  if (!ca_bundle.empty()) client_config["caBundle"] = ca_bundle;
  return {{"apiVersion", "admissionregistration.k8s.io/v1"},
          {"kind", "ValidatingWebhookConfiguration"},
          {"metadata", {{"name", "moeserve-quota"}}},
          {"webhooks",
           {{{"name", "quota.moeserve.io"},
             {"clientConfig", client_config},
             {"rules",
              {{{"apiGroups", {"moeserve.io"}},
                {"apiVersions", {"v1alpha1"}},
                {"resources", {"moedeployments", "moedeployments/scale"}},
                {"operations", {"CREATE", "UPDATE"}}}}},
             {"failurePolicy", failure_policy},
             {"sideEffects", "None"},
             {"admissionReviewVersions", {"v1"}},
             {"timeoutSeconds", 5}}}}};
}

inline std::string PolicyYaml(const std::string& name, int max_gpus, int max_replicas) {
  return "apiVersion: moeserve.io/v1alpha1\nkind: QuotaPolicy\nmetadata:\n  name: " + name +
         "\n  namespace: team-a\nspec:\n  limits:\n    maxGPUs: " + std::to_string(max_gpus) +
         "\n    maxReplicas: " + std::to_string(max_replicas) + "\n";
}

// replicas x 1 node x 8 GPUs.
inline std::string DeploymentYaml(const std::string& name, int replicas, const std::string& policy = "team-a") {
  std::string yaml = "apiVersion: moeserve.io/v1alpha1\nkind: MoEDeployment\nmetadata:\n  name: " + name +
                     "\n  namespace: team-a\nspec:\n  image: moeserve/moe-daemon:0.1.0\n  model: {uri: "
                     "s3://models/m/}\n  parallelism: {nodesPerReplica: 1, gpusPerNode: 8}\n  replicas: " +
                     std::to_string(replicas) + "\n";
  if (!policy.empty()) yaml += "  quotaPolicyRef: {name: " + policy + "}\n";
  return yaml;
}

inline size_t GroupsOf(fakes::FakeApiServer& server, const std::string& name) {
  return server.Count("statefulsets.apps", "team-a", [&](const nlohmann::json& o) {
    return o["metadata"]["labels"].value("app.kubernetes.io/instance", "") == name;
  });
}

}  // namespace moeserve::op::testing

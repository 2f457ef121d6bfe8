// config/ (the kustomize layout: `kubectl apply -k config/default`, and the
// vault and prometheus overlays) installs the same objects as the Helm chart
// with the matching values: the files under config/ are the chart's
// templates rendered with its defaults (labels say kustomize instead of Helm),
// config/crd holds the CRDs of crds/, and the only object config/ adds is
// the Namespace moeserve-system (helm's --create-namespace). Each overlay is
// compared with the chart rendered with that overlay's values.
//
// After a chart change, write config/ again from the chart with
//   MOESERVE_WRITE_CONFIG=1 ctest -R operator.config_kustomize
// and read the diff.
#include <gtest/gtest.h>

#include <cstdlib>

#include "chart_support.hpp"

namespace moeserve::op::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path ConfigDir() { return fs::path(SourceDir()) / "config"; }

// Which config/ folder holds each rendered template (a template missing
// here fails the test: a new template needs a home in config/ too).
const std::map<std::string, std::string>& Homes() {
  static const std::map<std::string, std::string> homes = {
      {"serviceaccount.yaml", "rbac"},
      {"operator-clusterrole.yaml", "rbac"},
      {"operator-clusterrole-cache-volumes.yaml", "rbac"},
      {"operator-clusterrole-tenant-objects.yaml", "rbac"},
      {"operator-clusterrolebinding.yaml", "rbac"},
      {"operator-role.yaml", "rbac"},
      {"operator-rolebinding.yaml", "rbac"},
      {"operator-cache-volumes-binding.yaml", "rbac"},
      {"operator-tenant-objects-binding.yaml", "rbac"},
      {"tenant-clusterrole.yaml", "rbac"},
      {"admin-clusterrole.yaml", "rbac"},
      {"deployment.yaml", "manager"},
      {"metrics-service.yaml", "manager"},
      {"webhook-service.yaml", "webhook"},
      {"validatingwebhookconfiguration.yaml", "webhook"},
      {"webhook-certificate.yaml", "webhook"},
      {"servicemonitor.yaml", "prometheus"},
      {"prometheusrule.yaml", "prometheus"},
      {"grafana-dashboard.yaml", "prometheus"},
  };
  return homes;
}

std::string Kustomized(const std::string& text) {
  return std::regex_replace(text, std::regex("app\\.kubernetes\\.io/managed-by: Helm"),
                            "app.kubernetes.io/managed-by: kustomize");
}

json WithValues(const std::vector<std::pair<std::string, json>>& sets) {
  auto values = LoadValues();
  EXPECT_TRUE(values) << values.error().ToString();
  json v = values ? *values : json::object();
  for (const auto& [k, x] : sets) SetValue(v, k, x);
  return v;
}

const std::vector<std::pair<std::string, json>> kVaultValues = {{"vault.addr", "https://vault.example:8200"}};
const std::vector<std::pair<std::string, json>> kPrometheusValues = {{"metrics.serviceMonitor.enabled", true},
                                                                     {"metrics.prometheusRule.enabled", true},
                                                                     {"grafana.dashboard.enabled", true}};

// kind/namespace/name -> object, with the one label that differs by tool dropped.
std::map<std::string, json> ByKey(const std::vector<json>& objects) {
  std::map<std::string, json> out;
  for (json o : objects) {
    if (o["metadata"].contains("labels")) o["metadata"]["labels"].erase("app.kubernetes.io/managed-by");
    if (o["metadata"].contains("labels") && o["metadata"]["labels"].empty()) o["metadata"].erase("labels");
    out[o.value("kind", "") + "/" + o["metadata"].value("namespace", "") + "/" + o["metadata"].value("name", "")] = o;
  }
  return out;
}

std::vector<json> ChartObjects(const json& values) {
  auto chart = RenderChart(values);
  EXPECT_TRUE(chart) << chart.error().ToString();
  std::vector<json> objects = chart ? chart->objects : std::vector<json>{};
  for (const auto& entry : fs::directory_iterator(ChartDir() / "crds")) {
    auto docs = fakes::LoadYamlFile(entry.path().string());
    EXPECT_TRUE(docs) << docs.error().ToString();
    if (docs)
      for (const auto& d : *docs) objects.push_back(d);
  }
  objects.push_back({{"apiVersion", "v1"},
                     {"kind", "Namespace"},
                     {"metadata", {{"name", "moeserve-system"}, {"labels", {{"app.kubernetes.io/name", "moeserve"}}}}}});
  return objects;
}

std::vector<json> KustomizeObjects(const std::string& overlay) {
  auto built = RunShell("kubectl kustomize " + (ConfigDir() / overlay).string());
  EXPECT_EQ(built.rc, 0) << built.output;
  auto docs = fakes::YamlDocumentsToJson(built.output);
  EXPECT_TRUE(docs) << docs.error().ToString();
  std::vector<json> out;
  if (docs)
    for (const auto& d : *docs)
      if (d.is_object()) out.push_back(d);
  return out;
}

void ExpectSameObjects(const std::vector<json>& chart, const std::vector<json>& config) {
  const auto want = ByKey(chart), got = ByKey(config);
  for (const auto& [key, o] : want) {
    auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << key << " is rendered by the chart but not built from config/";
      continue;
    }
    EXPECT_EQ(it->second, o) << key << " differs:\nchart:  " << o.dump() << "\nconfig: " << it->second.dump();
  }
  for (const auto& [key, o] : got)
    if (!want.contains(key)) ADD_FAILURE() << key << " is built from config/ but not rendered by the chart";
}

// Writes config/ from the chart (MOESERVE_WRITE_CONFIG=1).
void WriteConfig() {
  const std::string header = "# Rendered from charts/moeserve/templates/%s with the chart's default values\n"
                             "# (tests/operator/config_kustomize_test.cpp checks they stay the same objects).\n";
  auto write = [](const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  };
  std::map<std::string, std::vector<std::string>> resources;
  for (const auto& [values, folder_filter] :
       {std::pair{WithValues({}), std::string("")}, std::pair{WithValues(kPrometheusValues), std::string("prometheus")}}) {
    auto chart = RenderChart(values);
    ASSERT_TRUE(chart) << chart.error().ToString();
    for (const auto& [file, text] : chart->files) {
      auto home = Homes().find(file);
      ASSERT_NE(home, Homes().end()) << file << " has no folder in config/";
      if ((home->second == "prometheus") != !folder_filter.empty()) continue;
      auto docs = fakes::YamlDocumentsToJson(text);
      bool any = false;
      for (const auto& d : *docs) any = any || d.is_object();
      if (!any) continue;  // off with these values
      char buf[512];
      std::snprintf(buf, sizeof buf, header.c_str(), file.c_str());
      write(ConfigDir() / home->second / file, buf + Kustomized(text));
      resources[home->second].push_back(file);
    }
  }
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "crds")) {
    fs::create_directories(ConfigDir() / "crd");
    fs::copy_file(entry.path(), ConfigDir() / "crd" / entry.path().filename(), fs::copy_options::overwrite_existing);
    resources["crd"].push_back(entry.path().filename().string());
  }
  resources["manager"].insert(resources["manager"].begin(), "namespace.yaml");
  for (auto& [folder, files] : resources) {
    std::sort(files.begin() + (folder == "manager" ? 1 : 0), files.end());
    std::string k = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n";
    if (folder == "prometheus") k += "  - ../default\n";
    for (const auto& f : files) k += "  - " + f + "\n";
    write(ConfigDir() / folder / "kustomization.yaml", k);
  }
}

TEST(ConfigKustomize, SameObjectsAsTheChart) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  if (std::getenv("MOESERVE_WRITE_CONFIG")) WriteConfig();
  ExpectSameObjects(ChartObjects(WithValues({})), KustomizeObjects("default"));
}

TEST(ConfigKustomize, VaultOverlayIsTheChartWithVault) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  ExpectSameObjects(ChartObjects(WithValues(kVaultValues)), KustomizeObjects("vault"));
}

TEST(ConfigKustomize, PrometheusOverlayIsTheChartWithMonitoring) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  ExpectSameObjects(ChartObjects(WithValues(kPrometheusValues)), KustomizeObjects("prometheus"));
}

TEST(ConfigKustomize, CrdsAreThoseOfCrds) {
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "crds")) {
    const fs::path copy = ConfigDir() / "crd" / entry.path().filename();
    ASSERT_TRUE(fs::exists(copy)) << copy;
    EXPECT_EQ(ReadText(copy), ReadText(entry.path())) << copy << " differs from " << entry.path();
  }
}

// The layout installs on a fresh cluster in one command, as written.
TEST(ConfigKustomize, AppliesToAFreshCluster) {
  if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
  fakes::FakeApiServer server;
  ASSERT_GT(server.Start(0), 0);
  Kubectl kubectl(server);
  auto applied = kubectl("apply -k " + (ConfigDir() / "default").string());
  ASSERT_EQ(applied.rc, 0) << applied.output;
  EXPECT_TRUE(server.Get("namespaces", "", "moeserve-system"));
  EXPECT_TRUE(server.Get("deployments.apps", "moeserve-system", "moeserve-operator"));
  EXPECT_TRUE(server.Get("services", "moeserve-system", "moeserve-webhook"));
  EXPECT_TRUE(server.Get("validatingwebhookconfigurations.admissionregistration.k8s.io", "", "moeserve-quota"));
  EXPECT_TRUE(server.Get("customresourcedefinitions.apiextensions.k8s.io", "", "moedeployments.moeserve.io"));
}

}  // namespace
}  // namespace moeserve::op::testing

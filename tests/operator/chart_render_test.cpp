// charts/moeserve, rendered without helm (chart_support.hpp) and installed
// with the real kubectl into the API double: every value documented and
// used, a missing value an error, the CRDs the same bytes as crds/ (the one
// place they are edited; the chart's copies are cp'd from there), RBAC
// rules and CRDs free of template expressions, the operator Deployment
// restricted and leader-elected, the monitoring objects only when enabled
// and the PrometheusRule's groups those of policies/alerts.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "chart_support.hpp"
#include "operator_test_util.hpp"
#include "restricted_profile.hpp"

namespace moeserve::op::testing {
namespace {

constexpr char kNamespace[] = "moeserve-system";

// Leaf keys of values.yaml, dotted.
void Leaves(const json& node, const std::string& prefix, std::vector<std::string>& out) {
  if (!node.is_object()) return out.push_back(prefix);
  for (const auto& [k, v] : node.items()) Leaves(v, prefix.empty() ? k : prefix + "." + k, out);
}

json Rendered(const std::vector<std::pair<std::string, json>>& overrides = {}) {
  auto values = LoadValues();
  EXPECT_TRUE(values) << values.error().ToString();
  if (!values) return nullptr;
  for (const auto& [k, v] : overrides) SetValue(*values, k, v);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  EXPECT_TRUE(chart) << chart.error().ToString();
  return chart ? json(chart->objects) : json(nullptr);
}

json OperatorContainer(const json& objects) {
  const json d = FindObject(objects.get<std::vector<json>>(), "Deployment", "moeserve-operator");
  return d.is_object() ? d["spec"]["template"]["spec"]["containers"][0] : json(nullptr);
}

bool HasArg(const json& container, const std::string& arg) {
  for (const auto& a : container.value("args", json::array()))
    if (a == arg) return true;
  return false;
}

TEST(ChartRender, EveryValueIsDocumentedAndUsed) {
  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  std::vector<std::string> leaves;
  Leaves(*values, "", leaves);
  ASSERT_GT(leaves.size(), 20u);

  // A leaf is documented when the block of keys it sits in starts with a comment.
  std::vector<std::string> lines;
  {
    std::stringstream ss(ReadText(ChartDir() / "values.yaml"));
    for (std::string l; std::getline(ss, l);) lines.push_back(l);
  }
  std::vector<std::string> path;  // key per indent level
  std::set<std::string> documented;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const size_t indent = l.find_first_not_of(' ');
    if (indent == std::string::npos || l[indent] == '#') continue;
    const size_t colon = l.find(':');
    ASSERT_NE(colon, std::string::npos) << "values.yaml line " << i + 1 << ": " << l;
    path.resize(indent / 2);
    path.push_back(l.substr(indent, colon - indent));
    std::string dotted;
    for (const auto& p : path) dotted += (dotted.empty() ? "" : ".") + p;
    for (size_t j = i; j-- > 0;) {
      const size_t at = lines[j].find_first_not_of(' ');
      if (at == std::string::npos) break;     // a blank line ends the block
      if (lines[j][at] == '#') {
        documented.insert(dotted);
        break;
      }
    }
  }
  auto chart = RenderChart(*values);
  ASSERT_TRUE(chart) << chart.error().ToString();
  const std::set<std::string> used(chart->used_values.begin(), chart->used_values.end());
  for (const auto& leaf : leaves) {
    EXPECT_TRUE(documented.count(leaf)) << "values.yaml: " << leaf << " has no comment saying what it is";
    EXPECT_TRUE(used.count(leaf)) << "values.yaml: " << leaf << " is used by no template";
  }
}

TEST(ChartRender, MissingValuesAndOtherTemplateSyntaxAreErrors) {
  const json values = {{"a", {{"b", "x"}}}, {"on", true}, {"n", 3}, {"none", json::array()}, {"ns", {"x", "y"}}};
  const json chart = {{"appVersion", "1"}};
  auto ok = RenderTemplate("v: {{ .Values.a.b }} ns: {{ .Release.Namespace }}\n", values, {}, chart);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(*ok, "v: x ns: moeserve-system\n");
  EXPECT_FALSE(RenderTemplate("v: {{ .Values.a.c }}\n", values, {}, chart));
  EXPECT_FALSE(RenderTemplate("v: {{ .Values.a }}\n", values, {}, chart)) << "a map is not a scalar";
  EXPECT_FALSE(RenderTemplate("v: {{ toYaml .Values.a }}\n", values, {}, chart));
  EXPECT_FALSE(RenderTemplate("v: {{ .Values.a.b | quote }}\n", values, {}, chart));
  EXPECT_FALSE(RenderTemplate("{{- if .Values.on }}\nv: 1\n", values, {}, chart)) << "if without end";
  EXPECT_FALSE(RenderTemplate("{{- if .Values.n }}\nv: 1\n{{- end }}\n", values, {}, chart)) << "a number is no truth";
  auto off = RenderTemplate("a: 1\n{{- if .Values.on }}\nb: 2\n{{- else }}\nc: 3\n{{- end }}\n", values, {}, chart);
  ASSERT_TRUE(off);
  EXPECT_EQ(*off, "a: 1\nb: 2\n");
  // Helm's truth of strings and lists, and range over a list.
  auto lists = RenderTemplate("{{- if .Values.none }}\nempty: true\n{{- else }}\nempty: false\n{{- end }}\n"
                              "{{- if .Values.a.b }}\nb: set\n{{- end }}\n"
                              "{{- range .Values.ns }}\n- {{ . }} in {{ $.Release.Namespace }}\n{{- end }}\n",
                              values, {}, chart);
  ASSERT_TRUE(lists) << lists.error().ToString();
  EXPECT_EQ(*lists, "empty: false\nb: set\n- x in moeserve-system\n- y in moeserve-system\n");
  EXPECT_FALSE(RenderTemplate("{{- range .Values.ns }}\n- {{ .Release.Namespace }}\n{{- end }}\n", values, {}, chart))
      << "helm's dot is the element inside range";
  EXPECT_FALSE(RenderTemplate("{{- range .Values.a.b }}\n- {{ . }}\n{{- end }}\n", values, {}, chart)) << "not a list";
  EXPECT_FALSE(RenderTemplate("{{- range .Values.ns }}\n- {{ . }}\n", values, {}, chart)) << "range without end";
}

TEST(ChartRender, CrdsAreTheSameBytesAsTheSourceOfTruth) {
  std::set<std::string> source, copies;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(SourceDir()) / "crds"))
    source.insert(e.path().filename().string());
  for (const auto& e : std::filesystem::directory_iterator(ChartDir() / "crds")) copies.insert(e.path().filename().string());
  ASSERT_FALSE(source.empty());
  EXPECT_EQ(source, copies) << "charts/moeserve/crds/ must hold exactly crds/*.yaml";
  for (const auto& f : source) {
    const std::string copy_text = ReadText(ChartDir() / "crds" / f);
    const std::string original_text = ReadText(std::filesystem::path(SourceDir()) / "crds" / f);
    ASSERT_FALSE(original_text.empty()) << "crds/" << f;
    if (copy_text == original_text) continue;  // byte for byte, line ends and the last newline included
    // Say where: the first line that differs (or that only one of them has).
    std::stringstream copy(copy_text), original(original_text);
    int line = 1;
    for (std::string a, b;; ++line) {
      const bool more_a = static_cast<bool>(std::getline(copy, a)), more_b = static_cast<bool>(std::getline(original, b));
      if (more_a != more_b || a != b || (!more_a && !more_b)) break;
    }
    ADD_FAILURE() << "charts/moeserve/crds/" << f << " differs from crds/" << f << " at line " << line
                  << " (edit crds/, then: cp crds/*.yaml charts/moeserve/crds/)";
  }
}

TEST(ChartRender, RbacRulesAndCrdsHoldNoTemplateExpressions) {
  int rbac_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(ChartDir() / "templates")) {
    const std::string text = ReadText(e.path());
    if (text.find("\nkind: ClusterRole\n") == std::string::npos && text.find("\nkind: Role\n") == std::string::npos)
      continue;
    rbac_files++;
    EXPECT_EQ(text.find("{{"), std::string::npos) << e.path().filename() << " must be plain YAML";
  }
  EXPECT_EQ(rbac_files, 6) << "operator ClusterRoles (its own, tenant namespaces' objects, cache volumes) and Role, "
                               "moeserve-tenant, moeserve-admin";
  for (const auto& e : std::filesystem::directory_iterator(ChartDir() / "crds"))
    EXPECT_EQ(ReadText(e.path()).find("{{"), std::string::npos) << e.path().filename();
}

TEST(ChartRender, OperatorDeploymentIsRestrictedAndLeaderElected) {
  const json objects = Rendered();
  ASSERT_TRUE(objects.is_array());
  const json deployment = FindObject(objects.get<std::vector<json>>(), "Deployment", "moeserve-operator");
  ASSERT_TRUE(deployment.is_object());
  EXPECT_EQ(deployment["spec"]["replicas"], 2);
  const json pod = deployment["spec"]["template"]["spec"];
  const auto violations = RestrictedViolations(pod);
  EXPECT_TRUE(violations.empty()) << json(violations).dump(2);
  const json c = OperatorContainer(objects);
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(c["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(c["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(c["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(pod["securityContext"]["runAsNonRoot"], true);
  EXPECT_TRUE(HasArg(c, "--leader-elect"));
  EXPECT_TRUE(HasArg(c, "--leader-election-namespace=$(POD_NAMESPACE)"));
  bool downward = false;
  for (const auto& e : c["env"])
    if (e["name"] == "POD_NAMESPACE") downward = e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace";
  EXPECT_TRUE(downward) << "POD_NAMESPACE from the downward API";
  // Defaults are the operator's own defaults (docs/operations.md).
  for (const char* arg : {"--daemon-image=moeserve/moe-daemon:0.1.0", "--cache-root=/var/cache/moeserve",
                          "--shared-cache=false", "--cache-capacity-gi=16384", "--run-as-user=65532",
                          "--webhook-manage-certs=true", "--vault-addr="})
    EXPECT_TRUE(HasArg(c, arg)) << arg << " in " << c["args"].dump();

  // The same ServiceAccount runs the pod and is bound to both roles.
  const std::string sa = pod.value("serviceAccountName", "");
  EXPECT_TRUE(FindObject(objects.get<std::vector<json>>(), "ServiceAccount", sa).is_object());
  for (const char* kind : {"ClusterRoleBinding", "RoleBinding"}) {
    const json b = FindObject(objects.get<std::vector<json>>(), kind, "moeserve-operator");
    ASSERT_TRUE(b.is_object()) << kind;
    EXPECT_EQ(b["subjects"][0]["name"], sa);
    EXPECT_EQ(b["subjects"][0]["namespace"], kNamespace);
  }
}

TEST(ChartRender, OperatorConfigurationComesFromValues) {
  const json objects = Rendered({{"daemon.image", "registry.internal/moeserve/moe-daemon:0.2.0"},
                                 {"cache.root", "/mnt/models"},
                                 {"cache.shared", true},
                                 {"cache.capacityGi", 512},
                                 {"daemon.runAsUser", 1234},
                                 {"operator.watchNamespace", "team-a"},
                                 {"webhook.certManager.enabled", true},
                                 {"vault.addr", "https://vault.internal:8200"},
                                 {"vault.caCert.enabled", true}});
  ASSERT_TRUE(objects.is_array());
  const json c = OperatorContainer(objects);
  for (const char* arg : {"--daemon-image=registry.internal/moeserve/moe-daemon:0.2.0", "--cache-root=/mnt/models",
                          "--shared-cache=true", "--cache-capacity-gi=512", "--run-as-user=1234",
                          "--namespace=team-a", "--webhook-manage-certs=false",
                          "--vault-addr=https://vault.internal:8200", "--vault-cacert=/etc/moeserve/vault-ca/ca.crt"})
    EXPECT_TRUE(HasArg(c, arg)) << arg << " in " << c["args"].dump();
  EXPECT_FALSE(HasArg(c, "--webhook-manage-certs=true"));
  const json vwc = FindObject(objects.get<std::vector<json>>(), "ValidatingWebhookConfiguration", "moeserve-quota");
  EXPECT_EQ(vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "moeserve-system/moeserve-webhook");
  EXPECT_TRUE(FindObject(objects.get<std::vector<json>>(), "Certificate", "moeserve-webhook").is_object());
}

TEST(ChartRender, WebhookMatchesTheOperatorsNames) {
  const json objects = Rendered();
  ASSERT_TRUE(objects.is_array());
  const json vwc = FindObject(objects.get<std::vector<json>>(), "ValidatingWebhookConfiguration", "moeserve-quota");
  ASSERT_TRUE(vwc.is_object());
  ASSERT_EQ(vwc["webhooks"].size(), 1u);
  const json w = vwc["webhooks"][0];
  EXPECT_EQ(w["name"], "quota.moeserve.io");
  EXPECT_EQ(w["sideEffects"], "None");
  EXPECT_EQ(w["admissionReviewVersions"], json::array({"v1"}));
  EXPECT_EQ(w["clientConfig"]["service"],
            json({{"name", "moeserve-webhook"}, {"namespace", kNamespace},
                  {"path", "/validate-moeserve-io-v1alpha1-moedeployment"}, {"port", 443}}));
  EXPECT_FALSE(w["clientConfig"].contains("caBundle")) << "the leader writes it; helm must not reset it";
  EXPECT_EQ(w["rules"][0]["resources"], json::array({"moedeployments", "moedeployments/scale"}));
  EXPECT_EQ(w["rules"][0]["operations"], json::array({"CREATE", "UPDATE"}));
  const json svc = FindObject(objects.get<std::vector<json>>(), "Service", "moeserve-webhook");
  ASSERT_TRUE(svc.is_object());
  EXPECT_EQ(svc["spec"]["ports"][0]["port"], 443);
  EXPECT_EQ(svc["spec"]["ports"][0]["targetPort"], "webhook");
  bool port = false;
  const json container = OperatorContainer(objects);
  for (const auto& p : container["ports"]) port = port || (p["name"] == "webhook" && p["containerPort"] == 9443);
  EXPECT_TRUE(port);
  EXPECT_TRUE(HasArg(OperatorContainer(objects), "--webhook-addr=:9443"));
  EXPECT_TRUE(HasArg(OperatorContainer(objects), "--webhook-config=moeserve-quota"));
  EXPECT_TRUE(HasArg(OperatorContainer(objects), "--webhook-secret=moeserve-webhook-tls"));
  EXPECT_TRUE(HasArg(OperatorContainer(objects), "--webhook-service=moeserve-webhook"));
}

class ChartInstall : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_FAIL() << "kubectl is not installed (scripts/setup installs it)";
    ASSERT_GT(server_.Start(0), 0);
    ASSERT_TRUE(server_.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                              {"metadata", {{"name", kNamespace}}}}));
  }
  fakes::FakeApiServer server_;
};

TEST_F(ChartInstall, DefaultsApplyWithKubectl) {
  auto values = LoadValues();
  ASSERT_TRUE(values);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();
  Kubectl kubectl(server_);
  const std::string failed = InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kNamespace});
  ASSERT_EQ(failed, "");

  EXPECT_TRUE(server_.Get("customresourcedefinitions.apiextensions.k8s.io", "", "moedeployments.moeserve.io"));
  EXPECT_TRUE(server_.Get("customresourcedefinitions.apiextensions.k8s.io", "", "quotapolicies.moeserve.io"));
  EXPECT_TRUE(server_.Get("deployments.apps", kNamespace, "moeserve-operator"));
  EXPECT_TRUE(server_.Get("serviceaccounts", kNamespace, "moeserve-operator"));
  EXPECT_TRUE(server_.Get("services", kNamespace, "moeserve-operator-metrics"));
  EXPECT_TRUE(server_.Get("services", kNamespace, "moeserve-webhook"));
  EXPECT_TRUE(server_.Get("roles.rbac.authorization.k8s.io", kNamespace, "moeserve-operator"));
  EXPECT_TRUE(server_.Get("rolebindings.rbac.authorization.k8s.io", kNamespace, "moeserve-operator"));
  EXPECT_TRUE(server_.Get("clusterrolebindings.rbac.authorization.k8s.io", "", "moeserve-operator"));
  EXPECT_TRUE(server_.Get("validatingwebhookconfigurations.admissionregistration.k8s.io", "", "moeserve-quota"));
  for (const char* role : {"moeserve-operator", "moeserve-tenant", "moeserve-admin"})
    EXPECT_TRUE(server_.Get("clusterroles.rbac.authorization.k8s.io", "", role)) << role;
  // Optional monitoring objects are off by default (no Prometheus Operator CRDs needed).
  for (const auto& o : chart->objects)
    EXPECT_NE(o["apiVersion"], "monitoring.coreos.com/v1") << o["kind"];

  // A second install changes nothing, as helm upgrade with the same values.
  const std::string again = InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kNamespace});
  EXPECT_EQ(again, "");
}

// The Prometheus Operator's kinds, registered as its CRDs would be.
json MonitoringCrd(const std::string& kind, const std::string& plural, const std::string& singular) {
  return {{"apiVersion", "apiextensions.k8s.io/v1"},
          {"kind", "CustomResourceDefinition"},
          {"metadata", {{"name", plural + ".monitoring.coreos.com"}}},
          {"spec",
           {{"group", "monitoring.coreos.com"},
            {"scope", "Namespaced"},
            {"names", {{"plural", plural}, {"singular", singular}, {"kind", kind}}},
            {"versions",
             json::array({{{"name", "v1"},
                           {"served", true},
                           {"storage", true},
                           {"schema",
                            {{"openAPIV3Schema",
                              {{"type", "object"},
                               {"properties",
                                {{"spec", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}}}}}}}}})}}}};
}

TEST_F(ChartInstall, MonitoringObjectsWhenEnabledCarryThePolicyRules) {
  ASSERT_TRUE(server_.RegisterCrd(MonitoringCrd("ServiceMonitor", "servicemonitors", "servicemonitor")));
  ASSERT_TRUE(server_.RegisterCrd(MonitoringCrd("PrometheusRule", "prometheusrules", "prometheusrule")));
  auto values = LoadValues();
  ASSERT_TRUE(values);
  SetValue(*values, "metrics.serviceMonitor.enabled", true);
  SetValue(*values, "metrics.prometheusRule.enabled", true);
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();
  Kubectl kubectl(server_);
  ASSERT_EQ(InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kNamespace}), "");

  auto monitor = server_.Get("servicemonitors.monitoring.coreos.com", kNamespace, "moeserve-operator");
  ASSERT_TRUE(monitor);
  EXPECT_EQ((*monitor)["spec"]["endpoints"][0]["port"], "metrics");
  auto rule = server_.Get("prometheusrules.monitoring.coreos.com", kNamespace, "moeserve");
  ASSERT_TRUE(rule);
  auto policy = fakes::LoadYamlFile(SourceDir() + "/policies/alerts/moeserve-alerts.yaml");
  ASSERT_TRUE(policy) << policy.error().ToString();
  ASSERT_FALSE((*policy)[0]["groups"].empty());
  EXPECT_EQ((*rule)["spec"]["groups"], (*policy)[0]["groups"])
      << "templates/prometheusrule.yaml must carry policies/alerts/moeserve-alerts.yaml's groups unchanged";
}

}  // namespace
}  // namespace moeserve::op::testing

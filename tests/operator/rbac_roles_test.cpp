// The chart's moeserve-tenant and moeserve-admin ClusterRoles against what
// people really do with kubectl: every request kubectl makes for a tenant's
// work (apply, get, describe, scale, delete a MoEDeployment; read the
// QuotaPolicy) is granted to moeserve-tenant, and every request of an
// admin's work (apply a QuotaPolicy, label a Secret usable) to
// moeserve-admin. moeserve-tenant grants nothing on Secrets and cannot write
// QuotaPolicies or status, so the usable label and the quotas protect
// something. The requests are those the API double recorded, checked with
// RBAC's rule matching.
#include <gtest/gtest.h>

#include <set>

#include "chart_support.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

class RbacRoles : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(HaveKubectl()) << "kubectl is not installed (scripts/setup installs it)";
    auto values = LoadValues();
    ASSERT_TRUE(values) << values.error().ToString();
    auto chart = RenderChart(*values);
    ASSERT_TRUE(chart) << chart.error().ToString();
    tenant_ = FindObject(chart->objects, "ClusterRole", "moeserve-tenant");
    admin_ = FindObject(chart->objects, "ClusterRole", "moeserve-admin");
    ASSERT_TRUE(tenant_.is_object());
    ASSERT_TRUE(admin_.is_object());
    ASSERT_GT(server_.Start(0), 0);
    kubectl_ = std::make_unique<Kubectl>(server_);  // its kubeconfig names the port
    ASSERT_EQ((*kubectl_)("apply -f " + (ChartDir() / "crds").string()).rc, 0);
    ASSERT_TRUE(server_.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-a"}}}}));
  }

  // Runs kubectl and returns the resource requests it made.
  std::vector<fakes::RequestRecord> Run(const std::string& args) {
    const size_t before = server_.Requests().size();
    auto r = (*kubectl_)(args);
    EXPECT_EQ(r.rc, 0) << "kubectl " << args << "\n" << r.output;
    auto all = server_.Requests();
    std::vector<fakes::RequestRecord> made(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
    EXPECT_FALSE(made.empty()) << "kubectl " << args << " made no resource request";
    return made;
  }

  static std::string Describe(const fakes::RequestRecord& r) {
    return r.verb + " " + (r.group.empty() ? "core" : r.group) + "/" + r.resource +
           (r.subresource.empty() ? "" : "/" + r.subresource) + " in " + r.ns;
  }

  // Whether a role bound in team-a with a RoleBinding allows every request.
  static std::vector<std::string> Denied(const json& role, const std::vector<fakes::RequestRecord>& requests) {
    std::vector<std::string> out;
    for (const auto& r : requests)
      if (r.ns != "team-a" || !RoleAllows(role, r.verb, r.group, r.resource, r.subresource, r.name))
        out.push_back(Describe(r));
    return out;
  }

  fakes::FakeApiServer server_;
  std::unique_ptr<Kubectl> kubectl_;
  json tenant_, admin_;
};

const char kMoEDeployment[] = R"(apiVersion: moeserve.io/v1alpha1
kind: MoEDeployment
metadata: {name: ultra, namespace: team-a}
spec:
  image: moeserve/moe-daemon:0.1.0
  model: {uri: "s3://models/ultra/", revision: "2026-11-01"}
  parallelism: {nodesPerReplica: 1, gpusPerNode: 0}
)";

TEST_F(RbacRoles, TenantCanDoATenantsWork) {
  std::vector<fakes::RequestRecord> work;
  auto add = [&](const std::vector<fakes::RequestRecord>& more) { work.insert(work.end(), more.begin(), more.end()); };
  const std::string path = (std::filesystem::temp_directory_path() / ("moe-rbac-md-" + std::to_string(getpid()) + ".yaml")).string();
  std::ofstream(path) << kMoEDeployment;
  add(Run("apply -f " + path));
  add(Run("apply -f " + path));  // unchanged: a GET, maybe a PATCH
  add(Run("get moedeployments -n team-a"));
  add(Run("get moed ultra -n team-a -o yaml"));
  add(Run("scale moedeployment ultra -n team-a --replicas=2"));
  add(Run("describe moedeployment ultra -n team-a"));
  add(Run("get quotapolicies -n team-a"));
  add(Run("delete -f " + path));
  std::filesystem::remove(path);
  const auto denied = Denied(tenant_, work);
  EXPECT_TRUE(denied.empty()) << "moeserve-tenant lacks: " << json(denied).dump(2);
  bool scaled = false;
  for (const auto& r : work) scaled = scaled || r.subresource == "scale";
  EXPECT_TRUE(scaled) << "kubectl scale went through the scale subresource";
}

TEST_F(RbacRoles, AdminCanDoAnAdminsWorkAndTheTenantCannot) {
  ASSERT_TRUE(server_.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                          {"metadata", {{"name", "object-store"}, {"namespace", "team-a"}}},
                                          {"stringData", {{"AWS_ACCESS_KEY_ID", "key-id"}}}}));
  const auto quota = Run("apply -f " + SourceDir() + "/policies/quota/team.yaml");
  const auto label = Run("label secret object-store -n team-a moeserve.io/usable=true");
  auto labelled = server_.Get("secrets", "team-a", "object-store");
  ASSERT_TRUE(labelled);
  EXPECT_EQ((*labelled)["metadata"]["labels"]["moeserve.io/usable"], "true");

  for (const auto* work : {&quota, &label}) {
    const auto by_admin = Denied(admin_, *work);
    EXPECT_TRUE(by_admin.empty()) << "moeserve-admin lacks: " << json(by_admin).dump(2);
    EXPECT_FALSE(Denied(tenant_, *work).empty()) << "moeserve-tenant must not be able to do this";
  }
  // Labelling is all the admin role does to Secrets: it does not create them.
  EXPECT_FALSE(RoleAllows(admin_, "create", "", "secrets"));
}

TEST_F(RbacRoles, TenantHasNothingOnSecretsAndNoWritesToQuotaOrStatus) {
  for (const char* verb : {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}) {
    EXPECT_FALSE(RoleAllows(tenant_, verb, "", "secrets", "", "any")) << verb << " secrets";
    EXPECT_FALSE(RoleAllows(tenant_, verb, "", "secrets")) << verb << " secrets";
  }
  for (const char* verb : {"create", "update", "patch", "delete"})
    EXPECT_FALSE(RoleAllows(tenant_, verb, "moeserve.io", "quotapolicies")) << verb << " quotapolicies";
  for (const char* verb : {"update", "patch"}) {
    EXPECT_FALSE(RoleAllows(tenant_, verb, "moeserve.io", "moedeployments", "status")) << verb << " status";
    EXPECT_FALSE(RoleAllows(tenant_, verb, "moeserve.io", "quotapolicies", "status")) << verb << " status";
    EXPECT_FALSE(RoleAllows(admin_, verb, "moeserve.io", "moedeployments", "status")) << verb << " status (admin)";
  }
  for (const auto* role : {&tenant_, &admin_})
    for (const auto& rule : (*role)["rules"]) {
      for (const char* field : {"apiGroups", "resources", "verbs"})
        for (const auto& v : rule[field]) EXPECT_NE(v, "*") << (*role)["metadata"]["name"] << " has a wildcard";
    }
}

// The operator's own ClusterRole reads Secrets by name only. A list or
// watch of Secrets cannot be narrowed to a label by RBAC, so either would
// let whoever holds the operator's token read every Secret of the cluster:
// neither is granted (the operator watches no Secret), nor any delete.
TEST(RbacOperatorRole, SecretsByNameOnlyNoListWatchOrDelete) {
  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  auto chart = RenderChart(*values);
  ASSERT_TRUE(chart) << chart.error().ToString();
  const json role = FindObject(chart->objects, "ClusterRole", "moeserve-operator-tenant-objects");
  ASSERT_TRUE(role.is_object());
  EXPECT_FALSE(RoleAllows(FindObject(chart->objects, "ClusterRole", "moeserve-operator"), "get", "", "secrets", "", "x"))
      << "Secrets are granted only through moeserve-operator-tenant-objects, whose binding decides where";
  for (const char* verb : {"list", "watch", "delete", "deletecollection", "patch"}) {
    EXPECT_FALSE(RoleAllows(role, verb, "", "secrets")) << verb << " secrets, cluster-wide";
    EXPECT_FALSE(RoleAllows(role, verb, "", "secrets", "", "any")) << verb << " secrets by name";
  }
  for (const char* verb : {"get", "create", "update"}) EXPECT_TRUE(RoleAllows(role, verb, "", "secrets", "", "x")) << verb;
  const json own = FindObject(chart->objects, "Role", "moeserve-operator");
  ASSERT_TRUE(own.is_object());
  for (const char* verb : {"list", "watch"}) EXPECT_FALSE(RoleAllows(own, verb, "", "secrets")) << verb << " (Role)";
}

// operator.watchNamespaces: the operator's grants on Secrets and pods were
// cluster-wide whatever it watched, so its token could read every Secret and
// delete any pod of the cluster. With the namespaces listed, those grants
// are RoleBindings there alone, the Deployment passes --watch-namespace for
// each, and with cache.storageClassName no PersistentVolume grant is bound.
// By default they stay cluster-wide (documented in docs/operations.md).
TEST(RbacOperatorRole, WatchNamespacesBindSecretsAndPodsThereAlone) {
  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  auto grants_anywhere = [](const std::vector<BoundRole>& bound, const std::string& ns, const std::string& verb,
                            const std::string& resource) {
    for (const auto& b : bound)
      if ((b.ns.empty() || b.ns == ns) && RoleAllows(b.role, verb, "", resource, "", "x")) return true;
    return false;
  };
  {
    auto chart = RenderChart(*values);
    ASSERT_TRUE(chart) << chart.error().ToString();
    const auto bound = OperatorRoles(*chart, "moeserve-system");
    EXPECT_TRUE(grants_anywhere(bound, "any-namespace", "get", "secrets")) << "the default stays cluster-wide";
    EXPECT_TRUE(grants_anywhere(bound, "", "create", "persistentvolumes"));
  }
  SetValue(*values, "operator.watchNamespaces", json::array({"team-a", "team-b"}));
  SetValue(*values, "cache.storageClassName", "local-path");
  auto chart = RenderChart(*values);
  ASSERT_TRUE(chart) << chart.error().ToString();
  const auto bound = OperatorRoles(*chart, "moeserve-system");
  for (const std::string ns : {"team-a", "team-b"}) {
    SCOPED_TRACE(ns);
    for (const char* verb : {"get", "create", "update"}) EXPECT_TRUE(grants_anywhere(bound, ns, verb, "secrets")) << verb;
    for (const char* verb : {"get", "list", "delete"}) EXPECT_TRUE(grants_anywhere(bound, ns, verb, "pods")) << verb;
  }
  for (const char* verb : {"get", "create", "update"})
    EXPECT_FALSE(grants_anywhere(bound, "team-c", verb, "secrets")) << verb << " secrets outside the watched namespaces";
  for (const char* verb : {"get", "list", "delete"})
    EXPECT_FALSE(grants_anywhere(bound, "team-c", verb, "pods")) << verb << " pods outside the watched namespaces";
  for (const char* verb : {"get", "list", "watch", "create", "delete"})
    EXPECT_FALSE(grants_anywhere(bound, "", verb, "persistentvolumes")) << verb << " persistentvolumes";
  const json deployment = FindObject(chart->objects, "Deployment", "moeserve-operator");
  ASSERT_TRUE(deployment.is_object());
  std::set<std::string> args;
  for (const auto& a : deployment["spec"]["template"]["spec"]["containers"][0]["args"]) args.insert(a.get<std::string>());
  EXPECT_TRUE(args.count("--watch-namespace=team-a") && args.count("--watch-namespace=team-b")) << json(args).dump();
  EXPECT_TRUE(args.count("--cache-storage-class=local-path")) << json(args).dump();
  for (const auto& a : args) EXPECT_NE(a.rfind("--namespace=", 0), 0u) << a;
}

}  // namespace
}  // namespace moeserve::op::testing

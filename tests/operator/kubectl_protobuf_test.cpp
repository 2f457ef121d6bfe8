// kubectl's typed create commands send their object as protobuf
// (application/vnd.kubernetes.protobuf) and do not retry as JSON on a 415:
// the API double reads what the real kubectl sends for the kinds a platform
// engineer creates by hand (docs/operations.md's install steps), and refuses
// any other kind with a 415 Status that says so, never a 400 that reads like a
// server bug.
#include <gtest/gtest.h>

#include "operator_test_util.hpp"
#include "moeserve/common/base64.hpp"

using nlohmann::json;

namespace moeserve::op::testing {
namespace {

class KubectlProtobufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveKubectl()) GTEST_SKIP() << "kubectl not installed";
    ASSERT_GT(server_.Start(0), 0);
    kubectl_ = std::make_unique<Kubectl>(server_);
  }
  fakes::FakeApiServer server_;
  std::unique_ptr<Kubectl> kubectl_;
};

TEST_F(KubectlProtobufTest, CreateNamespaceAndSecret) {
  auto ns = (*kubectl_)("create namespace team-a");
  ASSERT_EQ(ns.rc, 0) << ns.output;
  EXPECT_NE(ns.output.find("namespace/team-a created"), std::string::npos) << ns.output;
  ASSERT_TRUE(server_.Get("namespaces", "", "team-a"));

  auto secret = (*kubectl_)("create secret generic object-store -n team-a --from-literal=AWS_ACCESS_KEY_ID=key-id "
                            "--from-literal=AWS_SECRET_ACCESS_KEY=s3cr=t");
  ASSERT_EQ(secret.rc, 0) << secret.output;
  auto stored = server_.Get("secrets", "team-a", "object-store");
  ASSERT_TRUE(stored);
  EXPECT_EQ(Base64Decode((*stored)["data"]["AWS_ACCESS_KEY_ID"].get<std::string>()), "key-id");
  EXPECT_EQ(Base64Decode((*stored)["data"]["AWS_SECRET_ACCESS_KEY"].get<std::string>()), "s3cr=t");
  EXPECT_EQ((*stored)["type"], "Opaque");  // the server's default for an untyped Secret
  EXPECT_FALSE((*stored)["metadata"].contains("generateName"));  // empty protobuf strings are unset

  auto labelled = (*kubectl_)("label secret object-store -n team-a moeserve.io/usable=true");
  ASSERT_EQ(labelled.rc, 0) << labelled.output;
  EXPECT_EQ((*server_.Get("secrets", "team-a", "object-store"))["metadata"]["labels"]["moeserve.io/usable"], "true");
}

TEST_F(KubectlProtobufTest, TheOtherKindsOfTheInstallSteps) {
  ASSERT_EQ((*kubectl_)("create namespace team-a").rc, 0);
  auto cm = (*kubectl_)("create configmap settings -n team-a --from-literal=mode=fast");
  ASSERT_EQ(cm.rc, 0) << cm.output;
  EXPECT_EQ((*server_.Get("configmaps", "team-a", "settings"))["data"]["mode"], "fast");

  auto sa = (*kubectl_)("create serviceaccount moeserve-vault -n team-a");
  ASSERT_EQ(sa.rc, 0) << sa.output;
  EXPECT_TRUE(server_.Get("serviceaccounts", "team-a", "moeserve-vault"));

  auto rb = (*kubectl_)("create rolebinding moeserve-tenant -n team-a --clusterrole=moeserve-tenant "
                        "--group=team-a-developers");
  ASSERT_EQ(rb.rc, 0) << rb.output;
  auto binding = server_.Get("rolebindings.rbac.authorization.k8s.io", "team-a", "moeserve-tenant");
  ASSERT_TRUE(binding);
  EXPECT_EQ((*binding)["roleRef"]["name"], "moeserve-tenant");
  EXPECT_EQ((*binding)["roleRef"]["kind"], "ClusterRole");
  ASSERT_EQ((*binding)["subjects"].size(), 1u);
  EXPECT_EQ((*binding)["subjects"][0]["name"], "team-a-developers");
  EXPECT_EQ((*binding)["subjects"][0]["kind"], "Group");
}

TEST_F(KubectlProtobufTest, RolesAndClusterRoleBindings) {
  ASSERT_EQ((*kubectl_)("create namespace team-a").rc, 0);
  auto role = (*kubectl_)("create role reader -n team-a --verb=get,list --resource=pods,configmaps");
  ASSERT_EQ(role.rc, 0) << role.output;
  auto stored = server_.Get("roles.rbac.authorization.k8s.io", "team-a", "reader");
  ASSERT_TRUE(stored);
  ASSERT_EQ((*stored)["rules"].size(), 1u) << stored->dump();
  EXPECT_EQ((*stored)["rules"][0]["verbs"], json::array({"get", "list"}));
  EXPECT_EQ((*stored)["rules"][0]["resources"], json::array({"pods", "configmaps"}));

  auto cr = (*kubectl_)("create clusterrole crd-reader --verb=get --resource=customresourcedefinitions.apiextensions.k8s.io");
  ASSERT_EQ(cr.rc, 0) << cr.output;
  auto cluster_role = server_.Get("clusterroles.rbac.authorization.k8s.io", "", "crd-reader");
  ASSERT_TRUE(cluster_role);
  EXPECT_EQ((*cluster_role)["rules"][0]["apiGroups"], json::array({"apiextensions.k8s.io"}));

  auto crb = (*kubectl_)("create clusterrolebinding crd-readers --clusterrole=crd-reader --serviceaccount=team-a:robot");
  ASSERT_EQ(crb.rc, 0) << crb.output;
  auto binding = server_.Get("clusterrolebindings.rbac.authorization.k8s.io", "", "crd-readers");
  ASSERT_TRUE(binding);
  EXPECT_EQ((*binding)["subjects"][0]["kind"], "ServiceAccount");
  EXPECT_EQ((*binding)["subjects"][0]["namespace"], "team-a");
  EXPECT_EQ((*binding)["roleRef"]["name"], "crd-reader");
}

// A kind the decoder does not read: 415 with a Status that names it, as
// kubectl prints it.
TEST_F(KubectlProtobufTest, AnotherKindIsRefusedPlainly) {
  ASSERT_EQ((*kubectl_)("create namespace team-a").rc, 0);
  auto deploy = (*kubectl_)("create deployment web -n team-a --image=registry.example/web:1");
  EXPECT_NE(deploy.rc, 0);
  EXPECT_NE(deploy.output.find("decodes protobuf for Namespace, Secret, ConfigMap, ServiceAccount, Role, ClusterRole, "
                               "RoleBinding and ClusterRoleBinding only, not apps/v1 Deployment"),
            std::string::npos)
      << deploy.output;
  bool saw_415 = false;
  for (const auto& r : server_.Requests())
    if (r.resource == "deployments" && r.verb == "create") saw_415 = saw_415 || r.status == 415;
  EXPECT_TRUE(saw_415);
}

}  // namespace
}  // namespace moeserve::op::testing

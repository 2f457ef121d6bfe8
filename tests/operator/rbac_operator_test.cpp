// The chart's RBAC for moe-operator is exactly what the operator uses.
//
// The chart is installed into the API double with kubectl (its CRDs,
// Role, ValidatingWebhookConfiguration...), and moe-operator runs as a
// process with the arguments of the chart's rendered Deployment (leader
// election, the quota webhook serving and managing its certificates, Vault
// on against the Vault double) through a whole lifecycle: two
// MoEDeployments under a QuotaPolicy created and made Ready (the test plays
// the StatefulSet controller and the kubelet), object-store credentials
// read from Vault with the namespace's own login (TokenRequest), their
// children edited behind the operator's back and restored, a new model
// revision rolled out (one pod changed between the operator's list and its
// delete, so the conflict path reads it again), scaled up and down with
// kubectl through the webhook, deleted through the finalizer, and a restart
// that finds a deletion pending and its cache volume already gone.
// Every request the operator made is then checked against the roles the
// chart binds to the operator's ServiceAccount (ClusterRoles through
// ClusterRoleBindings, the Role in its namespace): a call no rule grants is
// missing, a granted (group, resource, verb) no call used is spare. Both
// fail the test.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <set>

#include "chart_support.hpp"
#include "fake_vault.hpp"
#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

constexpr char kOperatorNamespace[] = "moeserve-system";


// The StatefulSet controller's part the rollout needs: every StatefulSet has
// its pods, owned by it and labelled from its template.
class PodController {
 public:
  explicit PodController(fakes::FakeApiServer& server) : server_(server) {
    thread_ = std::thread([this] {
      while (!stop_) {
        for (const auto& sts : server_.List("statefulsets.apps")) Reconcile(sts);
        std::this_thread::sleep_for(10ms);
      }
    });
  }
  ~PodController() {
    stop_ = true;
    thread_.join();
  }

 private:
  void Reconcile(const json& sts) {
    const std::string ns = sts["metadata"].value("namespace", "");
    const std::string name = sts["metadata"].value("name", "");
    if (sts["metadata"].contains("deletionTimestamp")) return;
    for (int i = 0; i < sts["spec"].value("replicas", 1); ++i) {
      const std::string pod = name + "-" + std::to_string(i);
      if (server_.Get("pods", ns, pod)) continue;
      json labels = sts["spec"]["template"]["metadata"].value("labels", json::object());
      labels["apps.kubernetes.io/pod-index"] = std::to_string(i);
      (void)server_.Create(
          "pods", {{"apiVersion", "v1"},
                   {"kind", "Pod"},
                   {"metadata",
                    {{"name", pod},
                     {"namespace", ns},
                     {"labels", labels},
                     {"ownerReferences", json::array({{{"apiVersion", "apps/v1"}, {"kind", "StatefulSet"},
                                                       {"name", name}, {"uid", sts["metadata"]["uid"]},
                                                       {"controller", true}}})}}},
                   {"spec", {{"containers", json::array({{{"name", "moe-daemon"}, {"image", "moe-daemon"}}})}}}});
    }
  }
  fakes::FakeApiServer& server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

bool ReadyAt(fakes::FakeApiServer& server, const std::string& name, const std::string& ready,
             const std::string& revision = "") {
  const json st = StatusOf(server, "team-a", name);
  return st.value("phase", "") == "Ready" && st.value("ready", "") == ready &&
         (revision.empty() || st.value("modelRevision", "") == revision);
}

// A child edited by someone else: its component label changed; the operator
// must put it back.
void Drift(fakes::FakeApiServer& server, const std::string& resource, const std::string& name) {
  ASSERT_TRUE(server.Mutate(resource, "team-a", name,
                            [](json& o) { o["metadata"]["labels"]["app.kubernetes.io/component"] = "drifted"; }))
      << resource << " " << name;
}

bool Restored(fakes::FakeApiServer& server, const std::string& resource, const std::string& name) {
  auto o = server.Get(resource, "team-a", name);
  return o && (*o)["metadata"]["labels"].value("app.kubernetes.io/component", "") != "drifted";
}

struct Grant {
  std::string group, resource, verb;
  std::string role;  // the bound role it comes from (BoundRole::label)
  auto operator<=>(const Grant&) const = default;
};

std::string Describe(const fakes::RequestRecord& r) {
  return r.verb + " " + (r.group.empty() ? "core" : r.group) + "/" + r.resource +
         (r.subresource.empty() ? "" : "/" + r.subresource) + (r.ns.empty() ? " (cluster)" : " in " + r.ns) +
         (r.name.empty() ? "" : " name " + r.name);
}

TEST(RbacOperator, ChartGrantsExactlyTheCallsTheOperatorMakes) {
  ASSERT_TRUE(std::filesystem::exists(OperatorBinary())) << "build moe-operator first: " << OperatorBinary();
  ASSERT_TRUE(HaveKubectl()) << "kubectl is not installed (scripts/setup installs it)";
  FakeCluster cluster;
  auto& server = cluster.server;
  (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                           {"metadata", {{"name", kOperatorNamespace}}}});  // FakeCluster may have made it

  // Vault: team-a's role binds its moeserve-vault ServiceAccount to its paths.
  fakes::FakeVault vault(server.url());
  fakes::FakeVaultRole vault_role;
  vault_role.bound_service_account_names = {"moeserve-vault"};
  vault_role.bound_service_account_namespaces = {"team-a"};
  vault_role.audience = "vault";
  vault_role.read_paths = {"secret/data/team-a/*"};
  vault.SetRole("team-a", vault_role);
  ASSERT_GT(vault.Start(0), 0);
  vault.Put("secret", "team-a/object-store", {{"AWS_ACCESS_KEY_ID", "team-a-key-id"}, {"AWS_SECRET_ACCESS_KEY", "team-a-secret"}});
  ASSERT_TRUE(server.Create("serviceaccounts", {{"apiVersion", "v1"}, {"kind", "ServiceAccount"},
                                                {"metadata", {{"name", "moeserve-vault"}, {"namespace", "team-a"}}}}));

  // The chart, as `helm install -n moeserve-system --set vault.addr=...` would install it.
  auto values = LoadValues();
  ASSERT_TRUE(values) << values.error().ToString();
  SetValue(*values, "vault.addr", vault.url());
  SetValue(*values, "vault.allowInsecureHttp", true);  // the double speaks plain http on loopback
  auto chart = RenderChart(*values, {.name = "moeserve", .ns = kOperatorNamespace});
  ASSERT_TRUE(chart) << chart.error().ToString();
  const std::vector<BoundRole> bound = OperatorRoles(*chart, kOperatorNamespace);
  ASSERT_FALSE(bound.empty());
  Kubectl kubectl(server);
  ASSERT_EQ(InstallChart(kubectl, *chart, {.name = "moeserve", .ns = kOperatorNamespace}), "");

  // Every replica serves the webhook; the double calls it through the chart's Service.
  const int webhook_port = FreePort();
  ASSERT_GT(webhook_port, 0);
  server.admission().MapService(kOperatorNamespace, "moeserve-webhook", {webhook_port});
  const std::string kubeconfig =
      (std::filesystem::temp_directory_path() / ("moe-rbac-" + std::to_string(getpid()) + ".yaml")).string();
  ASSERT_TRUE(server.WriteKubeconfig(kubeconfig));
  auto args_for = [&](const std::string& pod) {
    auto args = ChartArguments(*chart, kOperatorNamespace, pod);
    // Only the connection and the listeners differ from a pod: no fixed ports in tests.
    for (const char* extra : {"--metrics-addr=0", "--health-addr=0"}) args.push_back(extra);
    args.push_back("--webhook-addr=127.0.0.1:" + std::to_string(webhook_port));
    args.push_back("--kubeconfig=" + kubeconfig);
    // The scenario is short: the autoscaler looks every second, not every 15.
    args.push_back("--autoscale-interval=1");
    return args;
  };

  // Tenant keys in a usable Secret, so the operator reads a tenant's Secret.
  ASSERT_TRUE(server.Create("secrets", {{"apiVersion", "v1"}, {"kind", "Secret"},
                                        {"metadata", {{"name", "ultra-api-keys"}, {"namespace", "team-a"},
                                                      {"labels", {{kUsableLabel, "true"}}}}},
                                        {"stringData", {{"agents", "a-long-random-tenant-key"}}}}));
  // A QuotaPolicy governs the namespace: the webhook and the reconciler read it.
  ASSERT_TRUE(server.Create("quotapolicies.moeserve.io",
                            {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "QuotaPolicy"},
                             {"metadata", {{"name", "team-a"}, {"namespace", "team-a"}}},
                             {"spec", {{"limits", {{"maxGPUs", 64}, {"maxReplicas", 4}}}}}}));
  json ultra = MoEDeploymentManifest("team-a", "ultra", 1, 2);
  ultra["spec"]["endpoint"]["apiKeys"] = {{"secretRef", {{"name", "ultra-api-keys"}}}};
  ultra["spec"]["model"]["credentials"] = {{"vault", {{"path", "secret/data/team-a/object-store"}}}};
  ultra["spec"]["quotaPolicyRef"] = {{"name", "team-a"}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", ultra));
  json mini = MoEDeploymentManifest("team-a", "mini", 1, 1);
  mini["spec"]["quotaPolicyRef"] = {{"name", "team-a"}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", mini));

  Kubelet kubelet(server, 20ms);
  PodController pods(server);
  {
    OperatorProcess first(args_for("moeserve-operator-0"));
    ASSERT_TRUE(first.running());
    // 1. Created and Ready.
    ASSERT_TRUE(WaitFor([&] { return ReadyAt(server, "ultra", "1/1") && ReadyAt(server, "mini", "1/1"); }, 30s))
        << StatusOf(server, "team-a", "ultra").dump(2) << StatusOf(server, "team-a", "mini").dump(2);
    ASSERT_TRUE(WaitFor([&] { return server.List("pods", "team-a").size() == 3; }));
    // The object-store credentials came from Vault, read with team-a's own login.
    EXPECT_EQ(ConditionOf(server, "team-a", "ultra", "SecretsSynced").value("status", ""), "True");
    EXPECT_GE(vault.Count("POST", "/v1/auth/kubernetes/login"), 1u);
    EXPECT_GE(vault.Count("GET", "/v1/secret/data/team-a/object-store"), 1u);

    // 2. Children edited behind its back are put back.
    const std::vector<std::pair<std::string, std::string>> children = {
        {"configmaps", "ultra-config"},    {"secrets", "ultra-secrets"},
        {"services", "ultra"},             {"services", "ultra-r0"},
        {"statefulsets.apps", "ultra-r0"}, {"poddisruptionbudgets.policy", "ultra-r0"}};
    for (const auto& [resource, name] : children) Drift(server, resource, name);
    for (const auto& [resource, name] : children)
      EXPECT_TRUE(WaitFor([&] { return Restored(server, resource, name); })) << resource << " " << name;
    // The admin key's Secret in the operator's namespace, as if left by an
    // earlier deployment of the same name (another uid): replaced.
    const std::string ultra_uid = (*server.Get("moedeployments.moeserve.io", "team-a", "ultra"))["metadata"]["uid"];
    ASSERT_TRUE(server.Mutate("secrets", kOperatorNamespace, "moeserve-admin.team-a.ultra",
                              [](json& o) { o["metadata"]["labels"]["moeserve.io/owner-uid"] = "an-earlier-uid"; }));
    Drift(server, "services", "ultra");  // a watched change brings the reconcile (Secrets are not watched)
    EXPECT_TRUE(WaitFor([&] {
      auto s = server.Get("secrets", kOperatorNamespace, "moeserve-admin.team-a.ultra");
      return s && (*s)["metadata"]["labels"].value("moeserve.io/owner-uid", "") == ultra_uid;
    }));

    // 3. A new revision rolls the group. Pod requests are held back 700 ms, and
    //    a pod changes right after the operator listed it, so its delete
    //    (with uid and resourceVersion preconditions) conflicts and the
    //    operator reads the pod again before deleting it.
    const size_t before_roll = server.Requests().size();
    fakes::FakeFaults slow_pods;
    slow_pods.stall_resource = "pods";
    slow_pods.stall_ms = 700;  // the margin for the test to change the pod in between
    server.SetFaults(slow_pods);
    ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "ultra",
                              [](json& o) { o["spec"]["model"]["revision"] = "2026-12-01"; }));
    ASSERT_TRUE(WaitFor([&] {
      auto requests = server.Requests();
      for (size_t i = before_roll; i < requests.size(); ++i)
        if (requests[i].resource == "pods" && requests[i].verb == "list") return true;
      return false;
    }));
    for (const char* pod : {"ultra-r0-0", "ultra-r0-1"})
      (void)server.Mutate("pods", "team-a", pod, [](json& o) { o["status"]["phase"] = "Running"; }, true);
    ASSERT_TRUE(WaitFor([&] { return ReadyAt(server, "ultra", "1/1", "2026-12-01"); }, 30s))
        << StatusOf(server, "team-a", "ultra").dump(2);
    server.SetFaults({});

    // 4. Scaled up and down with kubectl, through the quota webhook.
    auto up = kubectl("scale moedeployment ultra -n team-a --replicas=2");
    ASSERT_EQ(up.rc, 0) << up.output;
    bool reviewed = false;
    for (const auto& call : server.admission().Calls())
      reviewed = reviewed || (call.subresource == "scale" && call.allowed && !call.failed);
    EXPECT_TRUE(reviewed) << "the operator's webhook never reviewed the scale";
    ASSERT_TRUE(WaitFor([&] { return ReadyAt(server, "ultra", "2/2"); }, 30s)) << StatusOf(server, "team-a", "ultra").dump(2);
    auto down = kubectl("scale moedeployment ultra -n team-a --replicas=1");
    ASSERT_EQ(down.rc, 0) << down.output;
    ASSERT_TRUE(WaitFor([&] { return ReadyAt(server, "ultra", "1/1") && !server.Get("statefulsets.apps", "team-a", "ultra-r1"); }, 30s));

    // 4b. The two-node group's NetworkPolicy, edited by hand, is put back.
    ASSERT_TRUE(server.Mutate("networkpolicies.networking.k8s.io", "team-a", "ultra-r0",
                              [](json& o) { o["spec"]["ingress"] = json::array(); }));
    ASSERT_TRUE(WaitFor([&] {
      auto p = server.Get("networkpolicies.networking.k8s.io", "team-a", "ultra-r0");
      return p && (*p)["spec"]["ingress"].size() == 2;
    }, 30s));

    // 4c. Autoscaling turned on for `mini` with a floor above its replicas:
    //     the autoscaler writes spec.replicas through the scale subresource
    //     (judged by the webhook) and records its decision in status.
    ASSERT_TRUE(server.Mutate("moedeployments.moeserve.io", "team-a", "mini", [](json& o) {
      o["spec"]["autoscaling"] = {{"minReplicas", 2}, {"maxReplicas", 2}, {"targets", {{"waitingRequestsPerReplica", 4}}}};
    }));
    ASSERT_TRUE(WaitFor([&] {
      auto md = server.Get("moedeployments.moeserve.io", "team-a", "mini");
      return md && (*md)["spec"].value("replicas", 0) == 2 &&
             !(*md).value("status", json::object()).value("autoscaling", json::object()).value("lastDecision", "").empty();
    }, 30s)) << StatusOf(server, "team-a", "mini").dump(2);

    // 5. Deleted through the finalizer: the cache volume goes with it.
    ASSERT_TRUE(server.Delete("moedeployments.moeserve.io", "team-a", "ultra"));
    ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "ultra"); }, 30s));
    EXPECT_FALSE(server.Get("persistentvolumes", "", "moeserve-cache.team-a.ultra"));
    EXPECT_EQ(first.Stop(), 0);
  }

  // 6. While no operator runs, `mini` is deleted and its cache volume removed
  //    by hand; the next operator finds the deletion pending and the volume
  //    gone from its cache, so it asks the API server for it.
  ASSERT_TRUE(server.Delete("persistentvolumes", "", "moeserve-cache.team-a.mini"));
  ASSERT_TRUE(server.Delete("moedeployments.moeserve.io", "team-a", "mini"));
  ASSERT_TRUE(server.Get("moedeployments.moeserve.io", "team-a", "mini")) << "the finalizer should hold it";
  {
    OperatorProcess second(args_for("moeserve-operator-1"));
    ASSERT_TRUE(second.running());
    ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "mini"); }, 30s));
    EXPECT_EQ(second.Stop(), 0);
  }
  std::filesystem::remove(kubeconfig);

  // What it called, against what the chart grants.
  std::vector<fakes::RequestRecord> calls;
  for (const auto& r : server.Requests())
    if (r.user_agent.rfind("moe-operator/", 0) == 0) calls.push_back(r);
  ASSERT_FALSE(calls.empty());
  std::set<Grant> used;
  std::set<std::string> missing;
  for (const auto& c : calls) {
    // A namespace's own bindings first (the Role in the operator's
    // namespace), then the cluster-wide ones.
    const BoundRole* by = nullptr;
    for (int pass = 0; pass < 2 && !by; ++pass)
      for (const auto& b : bound)
        if ((pass == 0 ? !b.ns.empty() && b.ns == c.ns : b.ns.empty()) &&
            RoleAllows(b.role, c.verb, c.group, c.resource, c.subresource, c.name)) {
          by = &b;
          break;
        }
    const std::string resource = c.subresource.empty() ? c.resource : c.resource + "/" + c.subresource;
    if (by) used.insert({c.group, resource, c.verb, by->label});
    else missing.insert(Describe(c));
  }
  for (const auto& m : missing) ADD_FAILURE() << "the chart does not grant a call the operator made: " << m;

  // Every (group, resource, verb) a bound role grants, with resourceNames
  // kept as they narrow a grant but cannot justify one alone.
  for (const auto& b : bound)
    for (const auto& rule : b.role.value("rules", json::array()))
      for (const auto& g : rule.value("apiGroups", json::array()))
        for (const auto& res : rule.value("resources", json::array()))
          for (const auto& v : rule.value("verbs", json::array())) {
            const Grant grant{g.get<std::string>(), res.get<std::string>(), v.get<std::string>(), b.label};
            EXPECT_NE(grant.verb, "*") << "a wildcard verb is never least privilege";
            EXPECT_NE(grant.resource, "*") << "a wildcard resource is never least privilege";
            EXPECT_TRUE(used.count(grant)) << "spare grant in " << b.label << ": " << grant.verb << " "
                                           << (grant.group.empty() ? "core" : grant.group) << "/" << grant.resource
                                           << " (no call of the scenario needed it)";
          }
  if (HasFailure()) {
    std::set<std::string> seen;
    for (const auto& c : calls) seen.insert(Describe({c.verb, c.group, "", c.resource, c.subresource,
                                                      c.ns == kOperatorNamespace ? c.ns : (c.ns.empty() ? "" : "<tenant>"), "", ""}));
    std::string all;
    for (const auto& s : seen) all += "  " + s + "\n";
    ADD_FAILURE() << "calls observed:\n" << all;
  }
}

}  // namespace
}  // namespace moeserve::op::testing

// operator.prefix_disk_volume: spec.prefixDisk gives every daemon pod an
// emptyDir (node-local, sized by the spec) mounted where the daemon's
// prefix_disk_dir points, with the daemon's byte and age bounds in its
// config; without it nothing changes. The location is the operator's: a
// tenant who names a path, a hostPath or another volume kind, or sizes out
// of range, gets an error naming the field, never a volume on the node.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <thread>

#include "moeserve/operator/moedeployment.hpp"
#include "spec_fixture.hpp"
#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace moeserve::op {
namespace {

using json = nlohmann::json;

using spec_fixture::kMeta;
using spec_fixture::Spec;

const json* Container(const json& sts, const std::string& name, const char* list = "containers") {
  for (const auto& c : sts["spec"]["template"]["spec"][list])
    if (c["name"] == name) return &c;
  return nullptr;
}

const json* Volume(const json& sts, const std::string& name) {
  for (const auto& v : sts["spec"]["template"]["spec"]["volumes"])
    if (v["name"] == name) return &v;
  return nullptr;
}

json DaemonConfig(const MoEDeploymentSpec& spec) {
  return json::parse(desired::ConfigMap(kMeta, spec)["data"]["config.yaml"].get<std::string>());
}

TEST(PrefixDiskVolume, SpecPrefixDiskAddsAnEmptyDirAtTheDaemonsPrefixDiskDir) {
  auto spec = ParseMoEDeploymentSpec(Spec({{"prefixDisk", {{"sizeGi", 20}, {"maxAgeSeconds", 86400}}}}));
  ASSERT_TRUE(spec) << spec.error().ToString();
  EXPECT_EQ(spec->prefix_disk_size_gi, 20);
  EXPECT_EQ(spec->prefix_disk_max_age_seconds, 86400);
  const json sts = desired::StatefulSet(kMeta, *spec, 0, "hash");
  const json* volume = Volume(sts, "prefix-disk");
  ASSERT_NE(volume, nullptr) << sts.dump(2);
  EXPECT_EQ(*volume, json({{"name", "prefix-disk"}, {"emptyDir", {{"sizeLimit", "20Gi"}}}}));
  for (const auto& v : sts["spec"]["template"]["spec"]["volumes"]) EXPECT_FALSE(v.contains("hostPath")) << v.dump();
  const json* daemon = Container(sts, "moe-daemon");
  ASSERT_NE(daemon, nullptr);
  int mounts = 0;
  for (const auto& m : (*daemon)["volumeMounts"])
    if (m["name"] == "prefix-disk") {
      ++mounts;
      EXPECT_EQ(m["mountPath"], kPrefixDiskDir);
      EXPECT_FALSE(m.value("readOnly", false));
    }
  EXPECT_EQ(mounts, 1);
  const json* puller = Container(sts, "pull-weights", "initContainers");
  ASSERT_NE(puller, nullptr);
  for (const auto& m : (*puller)["volumeMounts"]) EXPECT_NE(m["name"], "prefix-disk");  // the daemon's alone
  const json config = DaemonConfig(*spec);
  EXPECT_EQ(config["prefix_disk_dir"], kPrefixDiskDir);
  // 90% of 20 GiB: the files stay below the emptyDir's sizeLimit, which evicts the pod.
  EXPECT_EQ(config["prefix_disk_bytes"], int64_t{19327352832});
  EXPECT_EQ(config["prefix_disk_max_age_seconds"], 86400);
}

TEST(PrefixDiskVolume, WithoutSpecPrefixDiskNothingChanges) {
  auto spec = ParseMoEDeploymentSpec(Spec(json::object()));
  ASSERT_TRUE(spec) << spec.error().ToString();
  EXPECT_EQ(spec->prefix_disk_size_gi, 0);
  const json sts = desired::StatefulSet(kMeta, *spec, 0, "hash");
  EXPECT_EQ(Volume(sts, "prefix-disk"), nullptr);
  const json config = DaemonConfig(*spec);
  EXPECT_FALSE(config.contains("prefix_disk_dir"));
  EXPECT_FALSE(config.contains("prefix_disk_bytes"));
  // No age bound asked: the daemon's default (none) is left alone.
  auto ageless = ParseMoEDeploymentSpec(Spec({{"prefixDisk", {{"sizeGi", 1}}}}));
  ASSERT_TRUE(ageless) << ageless.error().ToString();
  const json c1 = DaemonConfig(*ageless);
  EXPECT_EQ(c1["prefix_disk_dir"], kPrefixDiskDir);
  EXPECT_EQ(c1["prefix_disk_bytes"], int64_t{966367641});
  EXPECT_FALSE(c1.contains("prefix_disk_max_age_seconds"));
}

TEST(PrefixDiskVolume, ASpecThatChangesTheTierChangesTheConfigHash) {
  auto off = ParseMoEDeploymentSpec(Spec(json::object()));
  auto on = ParseMoEDeploymentSpec(Spec({{"prefixDisk", {{"sizeGi", 4}}}}));
  auto aged = ParseMoEDeploymentSpec(Spec({{"prefixDisk", {{"sizeGi", 4}, {"maxAgeSeconds", 600}}}}));
  ASSERT_TRUE(off && on && aged);
  const std::string a = desired::ConfigMap(kMeta, *off)["data"]["config.yaml"];
  const std::string b = desired::ConfigMap(kMeta, *on)["data"]["config.yaml"];
  const std::string c = desired::ConfigMap(kMeta, *aged)["data"]["config.yaml"];
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
}

TEST(PrefixDiskVolume, HostileValuesAreRefusedNamingTheField) {
  struct Case {
    json disk;
    std::string field;  // the error must name it
    std::string says;   // and say this
  };
  const std::vector<Case> cases = {
      {{{"sizeGi", -1}}, "spec.prefixDisk.sizeGi", ">= 1"},
      {{{"sizeGi", 0}}, "spec.prefixDisk.sizeGi", ">= 1"},
      {{{"sizeGi", 65537}}, "spec.prefixDisk.sizeGi", "at most 65536"},
      {{{"sizeGi", "10Gi"}}, "spec.prefixDisk.sizeGi", "integer"},
      {{{"sizeGi", 1.5}}, "spec.prefixDisk.sizeGi", "integer"},
      {{{"sizeGi", uint64_t{1} << 63}}, "spec.prefixDisk.sizeGi", "at most"},
      {{{"maxAgeSeconds", 60}}, "spec.prefixDisk.sizeGi", "required"},
      {{{"sizeGi", 4}, {"maxAgeSeconds", -5}}, "spec.prefixDisk.maxAgeSeconds", ">= 0"},
      {{{"sizeGi", 4}, {"maxAgeSeconds", 31536001}}, "spec.prefixDisk.maxAgeSeconds", "at most"},
      {{{"sizeGi", 4}, {"hostPath", {{"path", "/"}}}}, "spec.prefixDisk.hostPath", "not supported"},
      {{{"sizeGi", 4}, {"hostPath", "/var/lib/kubelet"}}, "spec.prefixDisk.hostPath", "not supported"},
      {{{"sizeGi", 4}, {"path", "/etc"}}, "spec.prefixDisk.path", "not supported"},
      {{{"sizeGi", 4}, {"path", "../../../etc"}}, "spec.prefixDisk.path", "not supported"},
      {{{"sizeGi", 4}, {"subPath", "x"}}, "spec.prefixDisk.subPath", "not supported"},
      {{{"sizeGi", 4}, {"persistentVolumeClaim", {{"claimName", "other-tenant"}}}},
       "spec.prefixDisk.persistentVolumeClaim", "not supported"},
      {{{"sizeGi", 4}, {"medium", "Memory"}}, "spec.prefixDisk.medium", "not supported"},
      {json("20Gi"), "spec.prefixDisk", "must be an object"},
      {json::array({20}), "spec.prefixDisk", "must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.disk.dump());
    auto spec = ParseMoEDeploymentSpec(Spec({{"prefixDisk", c.disk}}));
    ASSERT_FALSE(spec) << "accepted";
    const std::string message = spec.error().message();
    EXPECT_NE(message.find(c.field), std::string::npos) << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
  }
  // The refusal of a location says where the files do go.
  auto refused = ParseMoEDeploymentSpec(Spec({{"prefixDisk", {{"sizeGi", 4}, {"hostPath", "/"}}}}));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find(kPrefixDiskDir), std::string::npos) << refused.error().message();
}

}  // namespace

namespace testing {
namespace {

// Through the API double with the CRD's schema and a running operator: the
// StatefulSet and ConfigMap it writes carry the tier; the schema refuses a
// negative size and a path; and an object stored with a hostPath (a schema
// that once allowed it) fails with a condition and gets no pods.
TEST(PrefixDiskVolume, TheReconciledGroupCarriesTheTier) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  json md = MoEDeploymentManifest("team-a", "agents", 1, 1);
  md["spec"]["prefixDisk"] = {{"sizeGi", 50}, {"maxAgeSeconds", 604800}};
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", md));
  json negative = MoEDeploymentManifest("team-a", "negative", 1, 1);
  negative["spec"]["prefixDisk"] = {{"sizeGi", -1}};
  EXPECT_FALSE(server.Create("moedeployments.moeserve.io", negative));
  json pathed = MoEDeploymentManifest("team-a", "pathed", 1, 1);
  pathed["spec"]["prefixDisk"] = {{"sizeGi", 1}, {"path", "/etc"}};
  auto pruned = server.Create("moedeployments.moeserve.io", pathed);
  if (pruned) EXPECT_FALSE((*pruned)["spec"]["prefixDisk"].contains("path")) << pruned->dump();  // dropped if stored

  RunningOperator running(*client, {});
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "agents-r0").has_value(); }));
  const json sts = *server.Get("statefulsets.apps", "team-a", "agents-r0");
  const json pod = sts["spec"]["template"]["spec"];
  bool volume = false, mounted = false;
  for (const auto& v : pod["volumes"]) {
    EXPECT_FALSE(v.contains("hostPath")) << v.dump();
    if (v["name"] == "prefix-disk") volume = v == json({{"name", "prefix-disk"}, {"emptyDir", {{"sizeLimit", "50Gi"}}}});
  }
  for (const auto& m : pod["containers"][0]["volumeMounts"])
    mounted |= m["name"] == "prefix-disk" && m["mountPath"] == kPrefixDiskDir;
  EXPECT_TRUE(volume) << pod["volumes"].dump();
  EXPECT_TRUE(mounted) << pod["containers"][0]["volumeMounts"].dump();
  ASSERT_TRUE(WaitFor([&] { return server.Get("configmaps", "team-a", "agents-config").has_value(); }));
  const json config =
      json::parse((*server.Get("configmaps", "team-a", "agents-config"))["data"]["config.yaml"].get<std::string>());
  EXPECT_EQ(config["prefix_disk_dir"], kPrefixDiskDir);
  EXPECT_EQ(config["prefix_disk_bytes"], (int64_t{50} << 30) * 9 / 10);
  EXPECT_EQ(config["prefix_disk_max_age_seconds"], 604800);
}

TEST(PrefixDiskVolume, AStoredHostPathIsAConditionNeverAVolume) {
  fakes::FakeApiServer server;
  const json ready = ReconcileUnknownSpecField(server, "prefixDisk", "hostPath", {{"sizeGi", 10}, {"hostPath", "/"}});
  EXPECT_EQ(ready["reason"], "InvalidSpec");
  EXPECT_NE(ready.value("message", "").find("spec.prefixDisk.hostPath"), std::string::npos) << ready.dump();
  EXPECT_TRUE(server.List("statefulsets.apps").empty());
}

}  // namespace
}  // namespace testing
}  // namespace moeserve::op

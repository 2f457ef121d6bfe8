// operator.state_volume: spec.state gives every daemon pod a
// PersistentVolumeClaim (StatefulSet volumeClaimTemplates) mounted at the
// daemon's state_dir, where its usage ledger lives; without it nothing
// changes (no claim templates, no state_dir, the ledger in memory).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moeserve/operator/moedeployment.hpp"
#include "spec_fixture.hpp"

namespace moeserve::op {
namespace {

using json = nlohmann::json;

using spec_fixture::kMeta;
using spec_fixture::Spec;

TEST(StateVolume, SpecStateAddsAClaimPerPodMountedAtTheStateDir) {
  auto spec = ParseMoEDeploymentSpec(Spec({{"state", {{"sizeGi", 3}, {"storageClassName", "fast-ssd"}}}}));
  ASSERT_TRUE(spec) << spec.error().ToString();
  EXPECT_EQ(spec->state_size_gi, 3);
  const json sts = desired::StatefulSet(kMeta, *spec, 0, "hash");
  ASSERT_TRUE(sts["spec"].contains("volumeClaimTemplates")) << sts.dump(2);
  const json& claim = sts["spec"]["volumeClaimTemplates"][0];
  EXPECT_EQ(claim["metadata"]["name"], "state");
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "3Gi");
  EXPECT_EQ(claim["spec"]["storageClassName"], "fast-ssd");
  EXPECT_EQ(claim["spec"]["accessModes"], json::array({"ReadWriteOnce"}));
  bool mounted = false;
  for (const auto& c : sts["spec"]["template"]["spec"]["containers"]) {
    if (c["name"] != "moe-daemon") continue;
    for (const auto& m : c["volumeMounts"]) mounted |= m["name"] == "state" && m["mountPath"] == kStateDir;
  }
  EXPECT_TRUE(mounted);
  const json cm = desired::ConfigMap(kMeta, *spec);
  const json config = json::parse(cm["data"]["config.yaml"].get<std::string>());
  EXPECT_EQ(config["state_dir"], kStateDir);
}

TEST(StateVolume, WithoutSpecStateNothingChanges) {
  auto spec = ParseMoEDeploymentSpec(Spec(json::object()));
  ASSERT_TRUE(spec) << spec.error().ToString();
  EXPECT_EQ(spec->state_size_gi, 0);
  const json sts = desired::StatefulSet(kMeta, *spec, 0, "hash");
  EXPECT_FALSE(sts["spec"].contains("volumeClaimTemplates"));
  const json config = json::parse(desired::ConfigMap(kMeta, *spec)["data"]["config.yaml"].get<std::string>());
  EXPECT_FALSE(config.contains("state_dir"));
  auto defaulted = ParseMoEDeploymentSpec(Spec({{"state", json::object()}}));
  ASSERT_TRUE(defaulted);
  EXPECT_EQ(defaulted->state_size_gi, 1);
  const json sts1 = desired::StatefulSet(kMeta, *defaulted, 0, "hash");
  EXPECT_FALSE(sts1["spec"]["volumeClaimTemplates"][0]["spec"].contains("storageClassName"));
}

}  // namespace
}  // namespace moeserve::op

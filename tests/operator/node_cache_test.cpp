// The node cache, attacked as a tenant would: before, every namespace shared
// one host directory that the tenant's own image wrote and later served from
// unverified. Now each deployment's cache is a claim bound in advance to a
// volume the operator made (per namespace on the node, unless the platform
// shares one), only the platform's image writes it (pulling with
// verification), and the tenant's container mounts it read-only.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

const json* Find(const json& list, const std::string& name) {
  for (const auto& item : list)
    if (item.value("name", "") == name) return &item;
  return nullptr;
}

bool HasArg(const json& args, const std::string& arg) {
  for (const auto& a : args)
    if (a == arg) return true;
  return false;
}

OperatorOptions PlatformOptions(bool shared) {
  OperatorOptions options;
  options.reconciler.platform.daemon_image = "registry.platform/moe-daemon:1.0";
  options.reconciler.platform.cache_root = "/srv/moe-cache";
  options.reconciler.platform.shared_cache = shared;
  return options;
}

TEST(NodeCache, PerNamespaceVolumeWrittenOnlyByThePlatformPuller) {
  FakeCluster cluster;
  auto& server = cluster.server;
  ASSERT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}}));
  auto client = cluster.Client();
  json a = MoEDeploymentManifest("team-a", "ultra", 1, 2);
  a["spec"]["image"] = "team-a.registry/their-own-daemon:latest";
  a["spec"]["cache"] = {{"sizeLimitGi", 200}};
  a["spec"]["model"]["endpoint"] = "https://s3.internal:9000";
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", a));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-b", "ultra", 1, 1)));
  RunningOperator running(*client, PlatformOptions(false));
  ASSERT_TRUE(WaitFor([&] { return server.List("statefulsets.apps").size() == 2; }));
  ASSERT_TRUE(WaitFor([&] { return server.List("persistentvolumes").size() == 2; }));

  std::map<std::string, std::string> host_path;
  for (const char* ns : {"team-a", "team-b"}) {
    SCOPED_TRACE(ns);
    auto md = *server.Get("moedeployments.moeserve.io", ns, "ultra");
    const std::string volume_name = desired::CacheVolumeName(md);
    auto volume = server.Get("persistentvolumes", "", volume_name);
    ASSERT_TRUE(volume) << volume_name;
    host_path[ns] = (*volume)["spec"]["hostPath"]["path"];
    EXPECT_EQ((*volume)["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    EXPECT_EQ((*volume)["spec"]["storageClassName"], kCacheStorageClass);
    // Bound in advance to this deployment's claim: no other claim can take it.
    EXPECT_EQ((*volume)["spec"]["claimRef"]["namespace"], ns);
    EXPECT_EQ((*volume)["spec"]["claimRef"]["name"], "ultra-cache");
    auto claim = server.Get("persistentvolumeclaims", ns, "ultra-cache");
    ASSERT_TRUE(claim);
    EXPECT_EQ((*claim)["spec"]["volumeName"], volume_name);
    EXPECT_EQ((*claim)["metadata"]["ownerReferences"][0]["uid"], md["metadata"]["uid"]);

    auto sts = *server.Get("statefulsets.apps", ns, "ultra-r0");
    const json pod = sts["spec"]["template"]["spec"];
    const json* cache = Find(pod["volumes"], "cache");
    ASSERT_TRUE(cache);
    EXPECT_EQ((*cache)["persistentVolumeClaim"]["claimName"], "ultra-cache");
    for (const auto& v : pod["volumes"]) EXPECT_FALSE(v.contains("hostPath")) << v.dump();

    // The writer: the platform's image, pulling with verification.
    const json& puller = pod["initContainers"][0];
    EXPECT_EQ(puller["image"], "registry.platform/moe-daemon:1.0");
    EXPECT_EQ(puller["args"][0], "pull");
    EXPECT_TRUE(HasArg(puller["args"], "s3://models/ultra/"));
    EXPECT_TRUE(HasArg(puller["args"], "--revision"));
    EXPECT_FALSE(HasArg(puller["args"], "--no-verify"));
    const json* puller_cache = Find(puller["volumeMounts"], "cache");
    ASSERT_TRUE(puller_cache);
    EXPECT_FALSE(puller_cache->value("readOnly", false));

    // The reader: whatever image the tenant chose, the cache read-only, no credentials.
    const json& server_container = pod["containers"][0];
    const json* serve_cache = Find(server_container["volumeMounts"], "cache");
    ASSERT_TRUE(serve_cache);
    EXPECT_EQ(serve_cache->value("readOnly", false), true);
    for (const auto& e : server_container["env"])
      EXPECT_EQ(e["name"].get<std::string>().rfind("AWS_", 0), std::string::npos) << e.dump();

    // The daemon serves the directory the puller verified; it never pulls itself.
    json serve = json::parse((*server.Get("configmaps", ns, "ultra-config"))["data"]["config.yaml"].get<std::string>());
    auto spec = ParseMoEDeploymentSpec(md["spec"]);
    ASSERT_TRUE(spec);
    EXPECT_EQ(serve["model"], desired::ModelDirectory(*spec));
    EXPECT_EQ(serve["model"].get<std::string>().rfind(std::string(kCacheDir) + "/models/", 0), 0u);
    EXPECT_FALSE(serve.contains("weights_cache"));
  }
  EXPECT_EQ(host_path["team-a"], "/srv/moe-cache/namespaces/team-a");
  EXPECT_EQ(host_path["team-b"], "/srv/moe-cache/namespaces/team-b");
  auto a_sts = *server.Get("statefulsets.apps", "team-a", "ultra-r0");
  const json a_args = a_sts["spec"]["template"]["spec"]["initContainers"][0]["args"];
  EXPECT_TRUE(HasArg(a_args, "https://s3.internal:9000"));
  EXPECT_TRUE(HasArg(a_args, "200GiB"));

  // A claim deleted by hand leaves its volume Released (Retain): it is replaced, not left unbindable.
  auto md_a = *server.Get("moedeployments.moeserve.io", "team-a", "ultra");
  const std::string volume_a = desired::CacheVolumeName(md_a);
  const std::string old_uid = (*server.Get("persistentvolumes", "", volume_a))["metadata"]["uid"];
  ASSERT_TRUE(server.Delete("persistentvolumeclaims", "team-a", "ultra-cache"));
  ASSERT_TRUE(server.Mutate("persistentvolumes", "", volume_a, [](json& o) { o["status"] = {{"phase", "Released"}}; }, true));
  ASSERT_TRUE(WaitFor([&] {
    auto v = server.Get("persistentvolumes", "", volume_a);
    return v && (*v)["metadata"]["uid"] != old_uid && server.Get("persistentvolumeclaims", "team-a", "ultra-cache");
  }));

  // Deleting the deployment takes its cluster-scoped volume too (the finalizer).
  ASSERT_TRUE(client->Delete(resources::kMoEDeployment, "team-a", "ultra"));
  ASSERT_TRUE(WaitFor([&] { return !server.Get("moedeployments.moeserve.io", "team-a", "ultra"); }));
  EXPECT_FALSE(server.Get("persistentvolumes", "", volume_a));
  EXPECT_FALSE(server.Get("persistentvolumeclaims", "team-a", "ultra-cache"));
  EXPECT_TRUE(server.Get("persistentvolumes", "", desired::CacheVolumeName(*server.Get("moedeployments.moeserve.io", "team-b", "ultra"))));
}

TEST(NodeCache, SharedCacheOnlyWhenThePlatformSaysSo) {
  FakeCluster cluster;
  auto& server = cluster.server;
  ASSERT_TRUE(server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "team-b"}}}}));
  auto client = cluster.Client();
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m", 1, 1)));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-b", "m", 1, 1)));
  RunningOperator running(*client, PlatformOptions(true));
  ASSERT_TRUE(WaitFor([&] { return server.List("persistentvolumes").size() == 2; }));
  for (const auto& v : server.List("persistentvolumes")) EXPECT_EQ(v["spec"]["hostPath"]["path"], "/srv/moe-cache");
}

TEST(NodeCache, VolumeNamesNeverCollideAcrossNamespaces) {
  // "a-b"/"c" and "a"/"b-c" joined with a dash would be one name.
  json x = {{"metadata", {{"namespace", "a-b"}, {"name", "c"}}}};
  json y = {{"metadata", {{"namespace", "a"}, {"name", "b-c"}}}};
  EXPECT_NE(desired::CacheVolumeName(x), desired::CacheVolumeName(y));
  json long_name = {{"metadata", {{"namespace", "ns"}, {"name", std::string(250, 'n')}}}};
  EXPECT_LE(desired::CacheVolumeName(long_name).size(), 253u);
}

}  // namespace
}  // namespace moeserve::op::testing

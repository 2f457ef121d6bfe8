// Every property of both CRDs has a description, so that `kubectl explain`
// documents each field instead of printing <no description>. The walk covers
// properties, array items and map values (additionalProperties) at every
// depth; the real kubectl then reads the schemas back from the API double's
// OpenAPI v3 endpoint, as it would from a cluster.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fake_apiserver.hpp"
#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace {

using nlohmann::json;

std::string SourceDir() {
  const char* d = std::getenv("MOESERVE_SOURCE_DIR");
  return d ? d : ".";
}

const std::array<const char*, 2> kCrdFiles = {"crds/moeserve.io_moedeployments.yaml",
                                               "crds/moeserve.io_quotapolicies.yaml"};

// Paths (a.b[].c{}) of schema nodes below `schema` that lack a non-empty
// description. `[]` is an array's items, `{}` a map's values.
void MissingDescriptions(const json& schema, const std::string& path, std::vector<std::string>& missing) {
  auto check = [&](const json& node, const std::string& where) {
    if (!node.is_object()) return;
    const auto d = node.find("description");
    if (d == node.end() || !d->is_string() || d->get<std::string>().empty()) missing.push_back(where);
    MissingDescriptions(node, where, missing);
  };
  if (!schema.is_object()) return;
  if (auto p = schema.find("properties"); p != schema.end() && p->is_object())
    for (const auto& [name, sub] : p->items()) check(sub, path.empty() ? name : path + "." + name);
  if (auto i = schema.find("items"); i != schema.end()) check(*i, path + "[]");
  if (auto a = schema.find("additionalProperties"); a != schema.end()) check(*a, path + "{}");
}

// Paths (field names only, as kubectl explain takes them) of nodes that have
// properties of their own, including through array items and map values.
void ObjectPaths(const json& schema, const std::string& path, std::vector<std::string>& out) {
  if (!schema.is_object()) return;
  if (auto p = schema.find("properties"); p != schema.end() && p->is_object() && !p->empty()) {
    out.push_back(path);
    for (const auto& [name, sub] : p->items()) ObjectPaths(sub, path.empty() ? name : path + "." + name, out);
  }
  if (auto i = schema.find("items"); i != schema.end()) ObjectPaths(*i, path, out);
  if (auto a = schema.find("additionalProperties"); a != schema.end()) ObjectPaths(*a, path, out);
}

json LoadCrd(const std::string& relative) {
  auto docs = moeserve::fakes::LoadYamlFile(SourceDir() + "/" + relative);
  EXPECT_TRUE(docs) << relative << ": " << (docs ? "" : docs.error().ToString());
  if (!docs || docs->empty()) return json();
  return docs->front();
}

TEST(CrdDescriptions, TheWalkFindsAMissingDescriptionAtEveryKindOfNode) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "documented": {"type": "string", "description": "yes"},
      "bare": {"type": "string"},
      "empty": {"type": "string", "description": ""},
      "list": {"type": "array", "description": "yes", "items": {"type": "object",
               "properties": {"inner": {"type": "integer"}}}},
      "map": {"type": "object", "description": "yes", "additionalProperties": {"type": "string"}}
    }
  })");
  std::vector<std::string> missing;
  MissingDescriptions(schema, "", missing);
  EXPECT_EQ(missing, (std::vector<std::string>{"bare", "empty", "list[]", "list[].inner", "map{}"}));
}

TEST(CrdDescriptions, EveryPropertyOfBothCrdsHasADescription) {
  for (const char* file : kCrdFiles) {
    const json crd = LoadCrd(file);
    ASSERT_TRUE(crd.is_object()) << file;
    const auto& versions = crd["spec"]["versions"];
    ASSERT_TRUE(versions.is_array() && !versions.empty()) << file;
    for (const auto& version : versions) {
      const json& root = version["schema"]["openAPIV3Schema"];
      ASSERT_TRUE(root.is_object()) << file;
      EXPECT_TRUE(root.contains("description")) << file << ": the root schema has no description";
      std::vector<std::string> missing;
      MissingDescriptions(root, "", missing);
      std::string list;
      for (const auto& m : missing) list += "  " + m + "\n";
      EXPECT_TRUE(missing.empty()) << file << " " << version.value("name", "") << ": no description on\n" << list;
    }
  }
}

using moeserve::op::testing::CommandResult;
using moeserve::op::testing::RunShell;

// Words of a description, with the line breaks kubectl adds taken out.
std::string Squash(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

TEST(CrdDescriptions, KubectlExplainPrintsThemFromTheApiServer) {
  if (RunShell("kubectl version --client").rc != 0) GTEST_SKIP() << "kubectl not installed";
  const auto dir = std::filesystem::temp_directory_path() / ("moe-explain-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  moeserve::fakes::FakeApiServer server;
  ASSERT_GT(server.Start(0), 0);
  const std::string kubeconfig = (dir / "kubeconfig").string();
  ASSERT_TRUE(server.WriteKubeconfig(kubeconfig));
  auto kubectl = [&](const std::string& args) {
    return RunShell("kubectl --kubeconfig " + kubeconfig + " --cache-dir " + (dir / "cache").string() +
                    " --request-timeout=20s " + args);
  };
  auto applied = kubectl("apply -f " + SourceDir() + "/crds/");
  ASSERT_EQ(applied.rc, 0) << applied.output;

  // Every object's explain lists its fields, each with its description.
  const std::array<const char*, 2> kinds = {"moedeployment", "quotapolicy"};
  for (size_t k = 0; k < kCrdFiles.size(); ++k) {
    const json crd = LoadCrd(kCrdFiles[k]);
    std::vector<std::string> paths;
    ObjectPaths(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "", paths);
    ASSERT_GT(paths.size(), 5u) << kCrdFiles[k];
    for (const auto& path : paths) {
      const std::string what = std::string(kinds[k]) + (path.empty() ? "" : "." + path);
      auto explained = kubectl("explain " + what);
      EXPECT_EQ(explained.rc, 0) << what << "\n" << explained.output;
      EXPECT_EQ(explained.output.find("<no description>"), std::string::npos) << what << "\n" << explained.output;
    }
  }

  // The field the CRD once left bare.
  auto model = kubectl("explain moedeployment.spec.model");
  ASSERT_EQ(model.rc, 0) << model.output;
  const json moed = LoadCrd(kCrdFiles[0]);
  const std::string model_text =
      moed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
          .value("description", "");
  ASSERT_FALSE(model_text.empty());
  EXPECT_NE(Squash(model.output).find(Squash(model_text)), std::string::npos) << model.output;
  server.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace

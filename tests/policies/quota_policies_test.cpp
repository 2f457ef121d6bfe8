// policies/quota: the example QuotaPolicies apply with the real kubectl to
// the API double serving crds/ (strict field validation, so a field the
// schema lacks is an error, not silently dropped), and every field of each
// file is stored as written.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace moeserve::op::testing {
namespace {

// Whether every field of `want` is in `have` with the same value; `where`
// names the first that is not.
bool Contains(const json& have, const json& want, const std::string& at, std::string* where) {
  if (want.is_object()) {
    if (!have.is_object()) return *where = at, false;
    for (const auto& [k, v] : want.items()) {
      if (!have.contains(k)) return *where = at + "." + k, false;
      if (!Contains(have[k], v, at + "." + k, where)) return false;
    }
    return true;
  }
  if (want.is_array()) {
    if (!have.is_array() || have.size() != want.size()) return *where = at, false;
    for (size_t i = 0; i < want.size(); ++i)
      if (!Contains(have[i], want[i], at + "[" + std::to_string(i) + "]", where)) return false;
    return true;
  }
  const bool same = want.is_number() && have.is_number() ? want.get<double>() == have.get<double>() : want == have;
  if (!same) *where = at;
  return same;
}

TEST(QuotaPolicies, ExamplesApplyAndAreStoredAsWritten) {
  ASSERT_TRUE(HaveKubectl()) << "kubectl is not installed (scripts/setup installs it)";
  fakes::FakeApiServer server;
  ASSERT_GT(server.Start(0), 0);
  Kubectl kubectl(server);
  auto crds = kubectl("apply -f " + SourceDir() + "/crds/");
  ASSERT_EQ(crds.rc, 0) << crds.output;

  const auto dir = std::filesystem::path(SourceDir()) / "policies" / "quota";
  std::vector<json> policies;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto docs = fakes::LoadYamlFile(e.path().string());
    ASSERT_TRUE(docs) << e.path() << ": " << docs.error().ToString();
    for (const auto& d : *docs) policies.push_back(d);
  }
  ASSERT_GE(policies.size(), 2u) << "a team's and a batch tenant's";
  for (const auto& p : policies) {
    ASSERT_EQ(p["kind"], "QuotaPolicy");
    const std::string ns = p["metadata"]["namespace"];
    (void)server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }

  auto applied = kubectl("apply -f " + dir.string());
  ASSERT_EQ(applied.rc, 0) << applied.output;
  for (const auto& p : policies) {
    const std::string ns = p["metadata"]["namespace"], name = p["metadata"]["name"];
    EXPECT_NE(applied.output.find("quotapolicy.moeserve.io/" + name + " created"), std::string::npos) << applied.output;
    auto stored = server.Get("quotapolicies.moeserve.io", ns, name);
    ASSERT_TRUE(stored) << ns << "/" << name;
    std::string where;
    EXPECT_TRUE(Contains((*stored)["spec"], p["spec"], "spec", &where))
        << ns << "/" << name << ": " << where << " was not stored as written:\n" << (*stored)["spec"].dump(2);
  }
  // Both kinds of tenant are covered: one budget that alerts, one that acts.
  std::set<std::string> actions;
  for (const auto& p : policies)
    for (const auto& b : p["spec"].value("budgets", json::array())) actions.insert(b.value("action", "alert"));
  EXPECT_TRUE(actions.count("alert"));
  EXPECT_TRUE(actions.count("downgrade"));
  EXPECT_TRUE(actions.count("block"));

  auto again = kubectl("apply -f " + dir.string());
  ASSERT_EQ(again.rc, 0) << again.output;
  EXPECT_EQ(again.output.find("created"), std::string::npos) << again.output;
}

TEST(QuotaPolicies, AFieldTheSchemaLacksIsRefused) {
  ASSERT_TRUE(HaveKubectl()) << "kubectl is not installed (scripts/setup installs it)";
  fakes::FakeApiServer server;
  ASSERT_GT(server.Start(0), 0);
  Kubectl kubectl(server);
  ASSERT_EQ(kubectl("apply -f " + SourceDir() + "/crds/").rc, 0);
  auto wrong = kubectl.Apply("wrong", "apiVersion: moeserve.io/v1alpha1\nkind: QuotaPolicy\nmetadata: {name: x, namespace: default}\n"
                                      "spec:\n  limits: {maxGPU: 8}\n");
  EXPECT_NE(wrong.rc, 0) << wrong.output;
  EXPECT_NE(wrong.output.find("maxGPU"), std::string::npos) << wrong.output;
  EXPECT_FALSE(server.Get("quotapolicies.moeserve.io", "default", "x"));
}

}  // namespace
}  // namespace moeserve::op::testing

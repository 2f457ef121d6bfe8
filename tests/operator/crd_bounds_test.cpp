// operator.crd_bounds: the MoEDeployment CRD's defaults and bounds against
// ParseMoEDeploymentSpec. The test walks spec's schema in
// crds/moeserve.io_moedeployments.yaml and, for every property with a
// `default`, `minimum`, `maximum` or `enum`, checks on a valid spec that has
// every block: the field absent parses as the field set to its default;
// the bound itself and every enum value are accepted; just outside the bound
// (one past an integer bound, a thousandth past a number's) and a value not
// in the enum are refused with an error that names the field. A field added
// to the schema with a bound is checked without editing this test (a bound
// the walk cannot reach, under an array or a map, fails it instead).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "moeserve/operator/moedeployment.hpp"
#include "yaml_json.hpp"

namespace moeserve::op {
namespace {

using nlohmann::json;

std::string SourceDir() {
  const char* d = std::getenv("MOESERVE_SOURCE_DIR");
  return d ? d : ".";
}

json SpecSchema() {
  auto docs = fakes::LoadYamlFile(SourceDir() + "/crds/moeserve.io_moedeployments.yaml");
  EXPECT_TRUE(docs) << (docs ? "" : docs.error().ToString());
  if (!docs || docs->empty()) return json();
  const json& versions = docs->front()["spec"]["versions"];
  EXPECT_EQ(versions.size(), 1u) << "walk every served version's schema";
  return versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
}

// A property of spec with at least one of the keywords checked here.
struct Bounded {
  std::vector<std::string> path;  // below spec
  json schema;
  std::string Field() const {
    std::string f = "spec";
    for (const std::string& p : path) f += "." + p;
    return f;
  }
};

constexpr const char* kKeywords[] = {"default", "minimum", "maximum", "enum"};

bool HasBound(const json& schema) {
  for (const char* k : kKeywords)
    if (schema.contains(k)) return true;
  return false;
}

void Walk(const json& schema, std::vector<std::string>& path, std::vector<Bounded>& out,
          std::vector<std::string>& unreachable) {
  if (!schema.is_object()) return;
  if (auto p = schema.find("properties"); p != schema.end())
    for (const auto& [name, sub] : p->items()) {
      path.push_back(name);
      if (HasBound(sub)) out.push_back({path, sub});
      Walk(sub, path, out, unreachable);
      path.pop_back();
    }
  // Bounds inside array items or map values would need an element to set;
  // none exist today, and one added must not pass unchecked.
  for (const char* nested : {"items", "additionalProperties"})
    if (auto n = schema.find(nested); n != schema.end() && n->is_object()) {
      std::vector<Bounded> inside;
      std::vector<std::string> at = path;
      at.push_back(nested);
      Walk(*n, at, inside, unreachable);
      if (HasBound(*n)) inside.push_back({at, *n});
      for (const Bounded& b : inside) unreachable.push_back(b.Field());
    }
}

// A spec that sets every block of the schema, valid as it stands.
json FullSpec() {
  return json::parse(R"({
    "image": "registry.example/moe-daemon:1",
    "model": {"uri": "s3://models/m/", "revision": "r1", "endpoint": "https://s3.example",
              "credentials": {"secretRef": {"name": "s3"}}},
    "vault": {"role": "team-a"},
    "engine": {"maxContextTokens": 8192,
               "thinking": {"defaultTier": "low", "budgets": {"low": 1, "medium": 2, "high": 3}}},
    "parallelism": {"nodesPerReplica": 2, "gpusPerNode": 1},
    "replicas": 2,
    "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}},
    "cache": {"sizeLimitGi": 10},
    "state": {"sizeGi": 3, "storageClassName": "fast"},
    "prefixDisk": {"sizeGi": 20, "maxAgeSeconds": 86400},
    "endpoint": {"port": 9000, "apiKeys": {"secretRef": {"name": "keys"}}, "tls": {"secretName": "tls"}},
    "quotaPolicyRef": {"name": "team-a"},
    "autoscaling": {"enabled": true, "minReplicas": 1, "maxReplicas": 4,
                    "targets": {"waitingRequestsPerReplica": 2, "ttftP90Seconds": 1.5, "kvCacheUsage": 0.5},
                    "scaleUpStabilizationSeconds": 10, "scaleDownDelaySeconds": 60},
    "rollout": {"maxUnavailableReplicas": 1}
  })");
}

// `spec` with the value at `path` set (parents created as objects), or
// removed when `value` is discarded.
json With(json spec, const std::vector<std::string>& path, const json& value) {
  json* at = &spec;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    if (!(*at)[path[i]].is_object()) (*at)[path[i]] = json::object();
    at = &(*at)[path[i]];
  }
  if (value.is_discarded()) at->erase(path.back());
  else (*at)[path.back()] = value;
  return spec;
}

json Absent() { return json(json::value_t::discarded); }

// A value just past `bound` on the side away from the valid range.
json Past(const json& schema, const json& bound, int direction) {
  if (schema.value("type", "") == "integer") return bound.get<int64_t>() + direction;
  const double b = bound.get<double>();
  return b + direction * 1e-3 * std::max(1.0, std::fabs(b));
}

std::vector<Bounded> BoundedFields(std::vector<std::string>* unreachable = nullptr) {
  std::vector<Bounded> out;
  std::vector<std::string> path, lost;
  Walk(SpecSchema(), path, out, lost);
  if (unreachable) *unreachable = lost;
  return out;
}

TEST(CrdBounds, TheWalkReachesEveryBoundedField) {
  std::vector<std::string> unreachable;
  const std::vector<Bounded> fields = BoundedFields(&unreachable);
  EXPECT_TRUE(unreachable.empty()) << "bounds under an array or map are not checked here: " << unreachable.front();
  std::set<std::string> names;
  for (const Bounded& b : fields) names.insert(b.Field());
  // A few that must be there (the walk itself is what is tested here).
  for (const char* f : {"spec.state.sizeGi", "spec.engine.maxContextTokens", "spec.engine.thinking.defaultTier",
                        "spec.engine.thinking.budgets.high", "spec.parallelism", "spec.endpoint.port",
                        "spec.autoscaling.targets.kvCacheUsage"})
    EXPECT_TRUE(names.contains(f)) << f;
  ASSERT_TRUE(ParseMoEDeploymentSpec(FullSpec())) << ParseMoEDeploymentSpec(FullSpec()).error().ToString();
}

TEST(CrdBounds, AnAbsentFieldParsesAsItsDefault) {
  int checked = 0;
  for (const Bounded& b : BoundedFields()) {
    if (!b.schema.contains("default")) continue;
    SCOPED_TRACE(b.Field() + " default " + b.schema["default"].dump());
    const auto absent = ParseMoEDeploymentSpec(With(FullSpec(), b.path, Absent()));
    const auto given = ParseMoEDeploymentSpec(With(FullSpec(), b.path, b.schema["default"]));
    ++checked;
    if (!absent || !given) {
      ADD_FAILURE() << (absent ? given : absent).error().ToString();
      continue;
    }
    EXPECT_TRUE(*absent == *given) << "the parser's default differs from the CRD's";
  }
  EXPECT_GT(checked, 0);
}

TEST(CrdBounds, EachBoundIsAcceptedAndJustPastItIsRefusedNamingTheField) {
  int checked = 0;
  for (const Bounded& b : BoundedFields()) {
    const std::string field = b.Field();
    for (const auto& [keyword, direction] : {std::pair<const char*, int>{"minimum", -1}, {"maximum", +1}}) {
      if (!b.schema.contains(keyword)) continue;
      const json bound = b.schema[keyword];
      SCOPED_TRACE(field + " " + keyword + " " + bound.dump());
      const auto at = ParseMoEDeploymentSpec(With(FullSpec(), b.path, bound));
      EXPECT_TRUE(at) << at.error().ToString();
      const json past = Past(b.schema, bound, direction);
      const auto refused = ParseMoEDeploymentSpec(With(FullSpec(), b.path, past));
      ++checked;
      if (refused) {
        ADD_FAILURE() << field << " = " << past.dump() << " was accepted";
        continue;
      }
      EXPECT_NE(refused.error().message().find(field + ":"), std::string::npos) << refused.error().message();
    }
    if (b.schema.contains("enum")) {
      SCOPED_TRACE(field + " enum " + b.schema["enum"].dump());
      for (const json& v : b.schema["enum"]) {
        const auto ok = ParseMoEDeploymentSpec(With(FullSpec(), b.path, v));
        EXPECT_TRUE(ok) << v.dump() << ": " << ok.error().ToString();
      }
      const json outside = "not-" + b.schema["enum"][0].get<std::string>();
      const auto refused = ParseMoEDeploymentSpec(With(FullSpec(), b.path, outside));
      ++checked;
      if (refused) {
        ADD_FAILURE() << field << " = " << outside.dump() << " was accepted";
        continue;
      }
      EXPECT_NE(refused.error().message().find(field + ":"), std::string::npos) << refused.error().message();
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace moeserve::op

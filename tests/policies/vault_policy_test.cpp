// policies/vault: the team policy grants read, and only read, on the team's
// own KV v2 paths: every Vault path the team's example MoEDeployments name
// is readable, another team's is not, nothing reaches sys/ or auth/, and no
// hook signing key is readable (those are the platform's: the
// moeserve-hooks policy alone reads them, and reads nothing else).
// Vault's path matching: a trailing `*` is a prefix match, `+` one segment.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace moeserve::op::testing {
namespace {

struct PathRule {
  std::string glob;
  std::vector<std::string> capabilities;
};

std::vector<PathRule> ParsePolicy(const std::string& hcl) {
  std::string text;
  std::stringstream ss(hcl);
  for (std::string line; std::getline(ss, line);)
    if (auto at = line.find_first_not_of(' '); at == std::string::npos || line[at] != '#') text += line + "\n";
  static const std::regex kPath(R"re(path\s+"([^"]+)"\s*\{\s*capabilities\s*=\s*\[([^\]]*)\]\s*\})re");
  static const std::regex kWord(R"re("([a-z]+)")re");
  std::vector<PathRule> out;
  for (std::sregex_iterator it(text.begin(), text.end(), kPath), end; it != end; ++it) {
    PathRule r{(*it)[1], {}};
    const std::string caps = (*it)[2];
    for (std::sregex_iterator c(caps.begin(), caps.end(), kWord); c != end; ++c) r.capabilities.push_back((*c)[1]);
    out.push_back(r);
  }
  return out;
}

bool GlobMatches(const std::string& glob, const std::string& path) {
  std::string re;
  for (size_t i = 0; i < glob.size(); ++i) {
    const char c = glob[i];
    if (c == '*' && i + 1 == glob.size()) re += ".*";
    else if (c == '+') re += "[^/]+";
    else if (std::string(".^$|()[]{}\\?*").find(c) != std::string::npos) re += std::string("\\") + c;
    else re += c;
  }
  return std::regex_match(path, std::regex(re));
}

bool Readable(const std::vector<PathRule>& rules, const std::string& path) {
  for (const auto& r : rules)
    if (GlobMatches(r.glob, path) && std::find(r.capabilities.begin(), r.capabilities.end(), "read") != r.capabilities.end())
      return true;
  return false;
}

void VaultPaths(const json& node, std::vector<std::string>& out) {
  if (node.is_object()) {
    if (node.contains("vault") && node["vault"].is_object() && node["vault"].contains("path"))
      out.push_back(node["vault"]["path"]);
    for (const auto& [k, v] : node.items()) VaultPaths(v, out);
  } else if (node.is_array()) {
    for (const auto& v : node) VaultPaths(v, out);
  }
}

std::vector<PathRule> LoadPolicy(const std::string& name) {
  std::ifstream in(std::filesystem::path(SourceDir()) / "policies" / "vault" / name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParsePolicy(ss.str());
}

// The Vault paths team-a's example objects name: its MoEDeployments'
// (`deployments`), and its QuotaPolicies' hook keys (`hooks`).
void TeamAExamplePaths(std::vector<std::string>& deployments, std::vector<std::string>& hooks) {
  for (const auto& file : {std::string("policies/quota/team.yaml"), std::string("examples/quotapolicy.yaml"),
                           std::string("examples/moedeployment.yaml")}) {
    auto docs = fakes::LoadYamlFile(SourceDir() + "/" + file);
    ASSERT_TRUE(docs) << file << ": " << docs.error().ToString();
    for (const auto& d : *docs)
      if (d.is_object() && d["metadata"].value("namespace", "") == "team-a")
        VaultPaths(d["spec"], d.value("kind", "") == "QuotaPolicy" ? hooks : deployments);
  }
}

TEST(VaultPolicy, TeamReadsItsOwnPathsOnly) {
  const auto rules = LoadPolicy("team-a.hcl");
  ASSERT_FALSE(rules.empty()) << "no path rule parsed";
  for (const auto& r : rules) {
    EXPECT_EQ(r.capabilities, std::vector<std::string>{"read"}) << r.glob << ": a team needs read only";
    EXPECT_EQ(r.glob.rfind("kv/data/team-a/", 0), 0u) << r.glob << " is outside team-a's KV v2 data";
  }

  // Every Vault path named by team-a's example MoEDeployments (they may
  // name none); none of its hooks' keys.
  std::vector<std::string> paths, hooks;
  ASSERT_NO_FATAL_FAILURE(TeamAExamplePaths(paths, hooks));
  ASSERT_FALSE(hooks.empty());
  for (const auto& p : paths) EXPECT_TRUE(Readable(rules, p)) << p << " is named by team-a but not readable";
  EXPECT_TRUE(Readable(rules, "kv/data/team-a/object-store"));
  for (const auto& p : hooks) EXPECT_FALSE(Readable(rules, p)) << p << " is a hook's signing key, readable by team-a";

  for (const char* other : {"kv/data/team-b/object-store", "kv/data/team-a", "kv/metadata/team-a/hook",
                            "sys/policies/acl/team-a", "auth/token/create", "kv/data/team-ab/x"})
    EXPECT_FALSE(Readable(rules, other)) << other << " must not be readable by team-a";
  EXPECT_TRUE(Readable(rules, "kv/data/team-a/nested/deeper")) << "the matcher itself must work";
}

TEST(VaultPolicy, TheHookRoleReadsHookKeysOnly) {
  const auto rules = LoadPolicy("moeserve-hooks.hcl");
  ASSERT_FALSE(rules.empty()) << "no path rule parsed";
  for (const auto& r : rules) {
    EXPECT_EQ(r.capabilities, std::vector<std::string>{"read"}) << r.glob;
    EXPECT_EQ(r.glob.rfind("kv/data/moeserve-hooks/", 0), 0u) << r.glob << " is outside the hook keys' prefix";
  }
  std::vector<std::string> deployments, hooks;
  ASSERT_NO_FATAL_FAILURE(TeamAExamplePaths(deployments, hooks));
  ASSERT_FALSE(hooks.empty());
  for (const auto& p : hooks) {
    EXPECT_EQ(p.rfind("kv/data/moeserve-hooks/team-a/", 0), 0u) << p << ": a team-a hook's key belongs under its folder";
    EXPECT_TRUE(Readable(rules, p)) << p;
  }
  for (const char* other : {"kv/data/team-a/object-store", "kv/data/moeserve-hooks", "kv/data/moeserve-hooks-x/y",
                            "kv/metadata/moeserve-hooks/team-a/hook", "sys/policies/acl/moeserve-hooks"})
    EXPECT_FALSE(Readable(rules, other)) << other << " must not be readable by the hook role";
}

}  // namespace
}  // namespace moeserve::op::testing

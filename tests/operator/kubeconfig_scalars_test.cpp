// operator.kubeconfig_scalars: every scalar of a kubeconfig (read by
// moe-operator out of cluster and by moectl) replaced in turn by null forms,
// empty text, whitespace, a map, a list and scalars of the other kinds. A
// kubeconfig is kubectl's format, so null and "" mean "unset" as they do for
// kubectl: a required field (current-context, the context's cluster, the
// server) unset is an error; an optional one loads unset, and never as the
// text "null". Everything else of the wrong kind is an error naming the
// field, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {
namespace {

const std::string kKubeconfig = R"(apiVersion: v1
kind: Config
current-context: dev  # text required current-context
contexts:
  - name: dev  # text required name
    context:
      cluster: local  # text required cluster
      user: admin  # text optional user
      namespace: team-a  # text optional namespace
clusters:
  - name: local  # text required name
    cluster:
      server: https://127.0.0.1:6443  # text required server
      certificate-authority: ca.crt  # text optional certificate-authority
      certificate-authority-data: Q0EtUEVN  # text optional certificate-authority-data
      insecure-skip-tls-verify: false  # bool optional insecure-skip-tls-verify
users:
  - name: admin  # text optional name
    user:
      token: t0ken-abc  # text optional token
      tokenFile: token.txt  # text optional tokenFile
      client-certificate: client.crt  # text optional client-certificate
      client-key: client.key  # text optional client-key
      client-certificate-data: Q0VSVA==  # text optional client-certificate-data
      client-key-data: S0VZ  # text optional client-key-data
)";

struct Replacement {
  std::string text, kind;  // kind: unset | blank | map | list | int | num | bool | text
};

const std::vector<Replacement> kReplacements = {
    {"", "unset"},      {"~", "unset"},       {"null", "unset"},   {"NULL", "unset"}, {"\"\"", "unset"},
    {"\"   \"", "blank"}, {"{a: 1}", "map"},    {"[1, 2]", "list"}, {"12345", "int"}, {"1.5", "num"},
    {"true", "bool"},   {"word-text", "text"},
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool SaysNull(const KubeConfig& c) {
  for (const std::string* s : {&c.server, &c.token, &c.token_file, &c.ca_file, &c.ca_data, &c.client_cert_file,
                               &c.client_cert_data, &c.client_key_file, &c.client_key_data, &c.namespace_name}) {
    if (s->find("null") != std::string::npos || s->find("NULL") != std::string::npos || s->ends_with("~")) return true;
  }
  return false;
}

TEST(KubeconfigScalars, EveryScalarOfTheWrongKindIsRefusedAndNullIsUnset) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("kubeconfig-scalars-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config").string();
  auto load = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
    return LoadKubeconfig(path);
  };
  ASSERT_TRUE(load(kKubeconfig)) << load(kKubeconfig).error().ToString();

  static const std::regex annotated(R"(^(\s*(?:- )?[A-Za-z-]+: )(.*?)(  # (text|bool) (required|optional) (\S+))$)");
  const auto lines = Lines(kKubeconfig);
  size_t checked = 0, fields = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(lines[i], m, annotated)) continue;
    ++fields;
    const std::string kind = m[4], need = m[5], field = m[6];
    for (const auto& r : kReplacements) {
      if (r.kind == kind) continue;
      auto changed = lines;
      changed[i] = m[1].str() + r.text + m[3].str();
      std::string text;
      for (const auto& l : changed) text += l + "\n";
      auto c = load(text);
      ++checked;
      const std::string what = field + " = " + r.text;
      if (r.kind == "unset" && need == "optional") {
        // kubectl's meaning: unset. What it stood for is gone, never "null".
        ASSERT_TRUE(c) << what << ": " << c.error().ToString();
        EXPECT_FALSE(SaysNull(*c)) << what << " was read as the text null";
        continue;
      }
      ASSERT_FALSE(c) << what << " was accepted";
      if (r.kind != "unset" && field != "name") {
        EXPECT_NE(c.error().message().find(field), std::string::npos) << what << ": " << c.error().message();
      }
    }
  }
  EXPECT_EQ(fields, 17u);
  EXPECT_GT(checked, 150u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::op

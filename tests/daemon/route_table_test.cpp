// daemon.route_table: every route the daemon declares (Daemon::Routes(), the
// table admission and dispatch both use) is walked over HTTP, so a route
// added to the table is covered without touching this test: any method the
// table does not declare for its path is 405, a tenant or admin route
// without a key is 401, an admin route with a tenant's key is 403, /metrics
// wants the metrics token or an admin key, and the probes answer anyone. A
// path no route matches is 404, whatever the method.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "daemon_harness.hpp"
#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon::testing {
namespace {

const std::map<std::string, std::string> kAdmin = {{"Authorization", "Bearer sk-admin-0123456789"}};
const std::map<std::string, std::string> kTenant = {{"Authorization", "Bearer sk-acme-0123456789"}};
const std::map<std::string, std::string> kWrongKey = {{"Authorization", "Bearer sk-nobody-0123456789"}};
const std::vector<std::string> kMethods = {"GET", "POST", "PUT", "DELETE", "PATCH"};

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/moe_route_table_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

// A concrete path for a pattern: each {name} segment becomes a sample id.
std::string SamplePath(const std::string& pattern) {
  std::string out;
  size_t i = 0;
  while (i < pattern.size()) {
    if (pattern[i] == '{') {
      out += "sess_a_0123456789abcdef";
      i = pattern.find('}', i) + 1;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

class RouteTable : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig c = TestConfig();
    c.api_keys_file = WriteFile("keys.yaml", R"(
keys:
  - {key: sk-acme-0123456789, tenant: acme}
  - {key: sk-admin-0123456789, tenant: ops, role: admin}
)");
    auto d = Daemon::Create(c);  // no model: every refusal below comes from the head
    ASSERT_TRUE(d) << d.error().ToString();
    daemon_ = std::move(*d);
    ASSERT_TRUE(daemon_->Start());
    port_ = PortOf(*daemon_);
    routes_ = daemon_->Routes();
  }
  std::unique_ptr<Daemon> daemon_;
  int port_ = 0;
  std::vector<RouteDescription> routes_;
};

TEST_F(RouteTable, DeclaresTheDocumentedRoutesWithTheirAuth) {
  std::map<std::string, std::string> declared;
  for (const auto& r : routes_) declared[r.method + " " + r.pattern] = std::string(RouteAuthName(r.auth));
  const std::map<std::string, std::string> documented = {
      {"POST /v1/chat/completions", "tenant"},
      {"GET /v1/models", "tenant"},
      {"GET /v1/usage", "tenant"},
      {"GET /v1/usage/history", "tenant"},
      {"POST /v1/sessions", "tenant"},
      {"GET /v1/sessions/{id}", "tenant"},
      {"DELETE /v1/sessions/{id}", "tenant"},
      {"POST /v1/sessions/{id}/chat/completions", "tenant"},
      {"PUT /v1/admin/spend", "admin"},
      {"GET /v1/admin/audit", "admin"},
      {"GET /healthz", "public"},
      {"GET /readyz", "public"},
      {"GET /metrics", "metrics"}};
  for (const auto& [route, auth] : documented) {
    ASSERT_TRUE(declared.count(route)) << route;
    EXPECT_EQ(declared[route], auth) << route;
  }
  EXPECT_EQ(declared.size(), routes_.size()) << "a method and path declared twice";
}

// daemon/README.md's endpoint table is the route table: every declared
// route is a row (method, path, who may call it) and every row a route.
TEST_F(RouteTable, TheDaemonReadmeListsExactlyTheDeclaredRoutes) {
  const char* source = std::getenv("MOESERVE_SOURCE_DIR");
  std::ifstream in(std::string(source ? source : MOESERVE_SOURCE_DIR_DEFAULT) + "/daemon/README.md");
  ASSERT_TRUE(in) << "daemon/README.md not found";
  std::set<std::string> documented;
  bool in_endpoints = false;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("## ")) in_endpoints = line == "## Endpoints";
    if (!in_endpoints || !line.starts_with("| `")) continue;
    // | `METHOD` | `PATH` | auth | what it does |
    std::vector<std::string> cells;
    for (size_t at = 1; at < line.size();) {
      const size_t bar = line.find('|', at);
      if (bar == std::string::npos) break;
      std::string cell = line.substr(at, bar - at);
      cell.erase(0, cell.find_first_not_of(" `"));
      cell.erase(cell.find_last_not_of(" `") + 1);
      cells.push_back(cell);
      at = bar + 1;
    }
    ASSERT_GE(cells.size(), 3u) << line;
    documented.insert(cells[0] + " " + cells[1] + " " + cells[2]);
  }
  std::set<std::string> declared;
  for (const auto& r : routes_) declared.insert(r.method + " " + r.pattern + " " + std::string(RouteAuthName(r.auth)));
  EXPECT_EQ(documented, declared) << "daemon/README.md's Endpoints table and the route table differ";
}

TEST_F(RouteTable, AnyUndeclaredMethodIs405WithOrWithoutAKey) {
  ASSERT_FALSE(routes_.empty());
  int checked = 0;
  for (const auto& r : routes_) {
    std::set<std::string> declared;
    for (const auto& other : routes_)
      if (other.pattern == r.pattern) declared.insert(other.method);
    for (const auto& method : kMethods) {
      if (declared.count(method)) continue;
      for (const auto* headers : {&kAdmin, &kTenant, &kWrongKey}) {
        auto got = Http(port_, method, SamplePath(r.pattern), method == "GET" ? "" : "{}", *headers);
        EXPECT_EQ(got.status, 405) << method << " " << r.pattern << ": " << got.body;
        EXPECT_EQ(got.Json()["error"].value("code", ""), "method_not_allowed") << got.body;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST_F(RouteTable, EachRouteAsksForTheKeyItsAuthNames) {
  int tenant_routes = 0, admin_routes = 0, public_routes = 0;
  for (const auto& r : routes_) {
    const std::string path = SamplePath(r.pattern);
    const std::string body = r.method == "GET" || r.method == "DELETE" ? "" : "{}";
    const std::string what = r.method + " " + r.pattern + " (" + std::string(RouteAuthName(r.auth)) + ")";
    switch (r.auth) {
      case RouteAuth::kTenant:
        ++tenant_routes;
        EXPECT_EQ(Http(port_, r.method, path, body).status, 401) << what;
        EXPECT_EQ(Http(port_, r.method, path, body, kWrongKey).status, 401) << what;
        EXPECT_NE(Http(port_, r.method, path, body, kTenant).status, 401) << what;
        break;
      case RouteAuth::kAdmin: {
        ++admin_routes;
        EXPECT_EQ(Http(port_, r.method, path, body).status, 401) << what;
        auto tenant = Http(port_, r.method, path, body, kTenant);
        EXPECT_EQ(tenant.status, 403) << what;
        EXPECT_EQ(tenant.Json()["error"].value("code", ""), "admin_only") << what;
        EXPECT_NE(Http(port_, r.method, path, body, kAdmin).status, 403) << what;
        break;
      }
      case RouteAuth::kMetrics:
        EXPECT_EQ(Http(port_, r.method, path, body).status, 401) << what;
        EXPECT_EQ(Http(port_, r.method, path, body, kTenant).status, 401) << what;
        EXPECT_EQ(Http(port_, r.method, path, body, kAdmin).status, 200) << what;
        break;
      case RouteAuth::kPublic: {
        ++public_routes;
        const int status = Http(port_, r.method, path, body).status;
        EXPECT_TRUE(status == 200 || status == 503) << what << ": " << status;
        break;
      }
    }
  }
  EXPECT_GT(tenant_routes, 0);
  EXPECT_GT(admin_routes, 0);
  EXPECT_GT(public_routes, 0);
}

TEST_F(RouteTable, PathsNoRouteMatchesAre404) {
  for (const std::string path : {"/v1/nothing", "/v1/sessions/", "/v1/sessions/a/b", "/v1/chat/completions/x",
                                 "/v1//completions", "/", "/metrics/x"}) {
    for (const auto& method : kMethods) {
      auto got = Http(port_, method, path, method == "GET" ? "" : "{}", kAdmin);
      EXPECT_EQ(got.status, 404) << method << " " << path << ": " << got.body;
    }
  }
}

}  // namespace
}  // namespace moeserve::daemon::testing

// moectl.errors: what moectl says, and its exit status, when the source
// fails: a daemon nobody listens for, a key the daemon refuses (401) or that
// may not read another tenant (403), a body that is not JSON or not the
// shape expected, an answer past the size cap, control bytes meant for the
// terminal, no kubeconfig, a cluster that does not answer; and a wrong
// command line (exit status 2).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "../daemon/daemon_harness.hpp"
#include "moectl_support.hpp"
#include "moeserve/moectl/daemon_source.hpp"

namespace moeserve::moectl::testing {
namespace {

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Answers every connection with `response` (raw HTTP), until destroyed.
class CannedServer {
 public:
  explicit CannedServer(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0 || stop_) {
          if (c >= 0) ::close(c);
          return;
        }
        char buf[4096];
        (void)::recv(c, buf, sizeof buf, 0);  // one small GET
        daemon::testing::SendAll(c, response_);
        ::close(c);
      }
    });
  }
  ~CannedServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string response_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string Ok200(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

TEST(Errors, ADaemonNobodyListensForIsNamed) {
  const int port = daemon::testing::FreeLoopbackPort();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto r = Moectl({"usage", "--daemon", url, "--api-key", "k", "--timeout", "5"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "cannot reach the daemon at " + url)) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// A daemon with keys but no model: /v1/usage answers before weights load.
class KeyedDaemon : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon::DaemonConfig c;
    c.model = "/nonexistent/tiny";
    c.served_model_name = "tiny";
    c.port = daemon::testing::FreeLoopbackPort();
    c.api_keys_file = TempPath("keys.yaml");
    std::ofstream(c.api_keys_file) << "keys:\n  - {key: sk-acme-0123456789, tenant: acme}\n";
    auto d = daemon::Daemon::Create(c);
    ASSERT_TRUE(d) << d.error().ToString();
    ASSERT_TRUE((*d)->Start());
    daemon_ = d->release();
  }
  static void TearDownTestSuite() {
    daemon_->Shutdown(1);
    delete daemon_;
  }
  inline static daemon::Daemon* daemon_ = nullptr;
};

TEST_F(KeyedDaemon, AWrongKeyIs401WithTheDaemonsWords) {
  auto r = Moectl({"usage", "--daemon", daemon_->url(), "--api-key", "sk-wrong-000000000"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "refused the API key (401 invalid_api_key")) << r.err;
  EXPECT_TRUE(Has(r.err, "--api-key")) << r.err;
  auto none = Moectl({"usage", "--daemon", daemon_->url()}, {{"MOECTL_API_KEY", ""}});
  EXPECT_EQ(none.rc, 1);
  EXPECT_TRUE(Has(none.err, "401")) << none.err;
}

TEST_F(KeyedDaemon, AnotherTenantsHistoryIs403) {
  auto r = Moectl({"usage", "--daemon", daemon_->url(), "--api-key", "sk-acme-0123456789", "--tenant", "beta",
                   "--chart", TempPath("no.png")});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "does not let this key read")) << r.err;
  EXPECT_TRUE(Has(r.err, "403")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(TempPath("no.png")));
  // The same key reads its own tenant (nothing spent: an empty table).
  auto own = Moectl({"usage", "--daemon", daemon_->url(), "--api-key", "sk-acme-0123456789"});
  EXPECT_EQ(own.rc, 0) << own.err;
  EXPECT_EQ(own.out, "No resources found.\n");
}

TEST(Errors, ABodyThatIsNotJsonIsReportedWithItsStart) {
  CannedServer server(Ok200("<html>gateway says hello</html>"));
  auto r = Moectl({"usage", "--daemon", server.url(), "--api-key", "k"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "not JSON")) << r.err;
  EXPECT_TRUE(Has(r.err, "<html>gateway says hello")) << r.err;
}

TEST(Errors, JsonOfTheWrongShapeIsReported) {
  CannedServer server(Ok200(R"({"data":[{"tenant":"a","tier":"low","period":"day","period_start":"x","cost_usd":"1"}]})"));
  auto r = Moectl({"usage", "--daemon", server.url(), "--api-key", "k", "-o", "json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "data[0].cost_usd is not a number")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Errors, AnAnswerPastTheCapIsRefusedNotRead) {
  CannedServer server(Ok200(R"({"data":[)" + std::string(8192, ' ') + "]}"));
  DaemonTarget target{server.url(), "k", 5};
  target.max_body_bytes = 4096;
  auto rows = FetchDaemonUsage(target);
  ASSERT_FALSE(rows);
  EXPECT_TRUE(Has(rows.error().message(), "answered more than 4096 bytes")) << rows.error().message();
  target.max_body_bytes = 1 << 20;  // the same answer under a larger cap parses
  auto ok = FetchDaemonUsage(target);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_TRUE(ok->empty());
}

// A hostile daemon (or a tenant name someone chose) cannot send escape
// sequences or line breaks to the SRE's terminal through a table or an error.
TEST(Errors, ControlBytesFromThePeerAreEscapedOnTheTerminal) {
  CannedServer rows(Ok200(
      R"({"data":[{"tenant":"evil\u001b[2J\nFAKE-ROW","tier":"low","period":"day","period_start":"2026-12-04T00:00:00Z","cost_usd":1,"tokens":{}}]})"));
  auto table = Moectl({"usage", "--daemon", rows.url(), "--api-key", "k"});
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_FALSE(Has(table.out, "\x1b")) << table.out;
  EXPECT_TRUE(Has(table.out, "evil\\x1b[2J\\x0aFAKE-ROW")) << table.out;
  EXPECT_EQ(std::count(table.out.begin(), table.out.end(), '\n'), 2);  // the header and one row
  auto yaml = Moectl({"usage", "--daemon", rows.url(), "--api-key", "k", "-o", "yaml"});
  ASSERT_EQ(yaml.rc, 0) << yaml.err;
  EXPECT_FALSE(Has(yaml.out, "\x1b")) << yaml.out;

  const std::string body = R"({"error":{"code":"invalid_api_key","message":"no\u001b]0;owned\u0007"}})";
  CannedServer refused("HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  auto err = Moectl({"usage", "--daemon", refused.url(), "--api-key", "k"});
  EXPECT_EQ(err.rc, 1);
  EXPECT_FALSE(Has(err.err, "\x1b")) << err.err;
  EXPECT_TRUE(Has(err.err, "no\\x1b]0;owned\\x07")) << err.err;
}

TEST(Errors, NoKubeconfigSaysWhereItLooked) {
  const std::string home = TempPath("empty-home");
  std::filesystem::create_directories(home);
  auto r = Moectl({"usage"}, {{"KUBECONFIG", ""}, {"HOME", home}, {"KUBERNETES_SERVICE_HOST", ""}});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "no cluster to read QuotaPolicies from")) << r.err;
  EXPECT_TRUE(Has(r.err, "--kubeconfig")) << r.err;
  auto missing = Moectl({"alerts", "--kubeconfig", "/nonexistent/kubeconfig"});
  EXPECT_EQ(missing.rc, 1);
  EXPECT_TRUE(Has(missing.err, "/nonexistent/kubeconfig")) << missing.err;
}

TEST(Errors, AClusterThatDoesNotAnswerIsNamed) {
  const std::string kubeconfig = TempPath("dead-kubeconfig");
  const int port = daemon::testing::FreeLoopbackPort();
  std::ofstream(kubeconfig) << "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:"
                            << port << "\ncontexts:\n- name: c\n  context: {cluster: c, user: u, namespace: team-a}\n"
                            << "current-context: c\nusers:\n- name: u\n  user: {token: t}\n";
  auto r = Moectl({"budgets", "--kubeconfig", kubeconfig, "--timeout", "5"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(Has(r.err, "cannot list QuotaPolicies in namespace team-a at http://127.0.0.1:" + std::to_string(port)))
      << r.err;
}

TEST(Errors, AWrongCommandLineIsExitStatus2) {
  EXPECT_EQ(Moectl({}).rc, 2);
  auto fmt = Moectl({"usage", "-o", "xml"});
  EXPECT_EQ(fmt.rc, 2);
  EXPECT_TRUE(Has(fmt.err, "-o must be table, json or yaml")) << fmt.err;
  EXPECT_EQ(Moectl({"spend"}).rc, 2);
  auto chart = Moectl({"usage", "--chart", TempPath("x.png")});
  EXPECT_EQ(chart.rc, 2);
  EXPECT_TRUE(Has(chart.err, "--chart needs --daemon")) << chart.err;
  EXPECT_EQ(Moectl({"alerts", "--daemon", "http://127.0.0.1:1"}).rc, 2);
  EXPECT_EQ(Moectl({"usage", "--daemon"}).rc, 2);
  auto help = Moectl({"--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_TRUE(Has(help.out, "moectl usage")) << help.out;
}

}  // namespace
}  // namespace moeserve::moectl::testing

// The daemon serving TLS: openssl s_client and the official openai client
// against a self-signed certificate, and a certificate swap picked up without
// a restart (as a Kubernetes Secret mount swaps its files).
#include <cstdio>
#include <fstream>
#include <thread>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

bool HaveOpenssl() { return std::system("command -v openssl >/dev/null 2>&1") == 0; }

// A self-signed pair for 127.0.0.1 with the given common name, written to
// temporary files and then renamed over `cert`/`key` (an atomic swap).
void MakeCertificate(const std::string& common_name, const std::string& cert, const std::string& key) {
  const std::string tmp_cert = cert + ".new", tmp_key = key + ".new";
  std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=" + common_name +
                    " -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout '" + tmp_key + "' -out '" + tmp_cert +
                    "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_EQ(std::rename(tmp_key.c_str(), key.c_str()), 0);
  ASSERT_EQ(std::rename(tmp_cert.c_str(), cert.c_str()), 0);
}

// One GET over TLS with openssl s_client; returns its whole output
// (certificate subject, then the HTTP answer).
std::string SClientGet(int port, const std::string& path) {
  return RunCommand("printf 'GET " + path + " HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' | " +
             "timeout 20 openssl s_client -connect 127.0.0.1:" + std::to_string(port) +
             " -servername localhost -ign_eof 2>&1");
}

class HttpTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveOpenssl()) GTEST_SKIP() << "the openssl command is missing (scripts/setup installs it)";
    dir_ = ::testing::TempDir() + "/moe_tls_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    cert_ = dir_ + "/tls.crt";
    key_ = dir_ + "/tls.key";
    MakeCertificate("moeserve-first", cert_, key_);
    DaemonConfig c = TestConfig();
    c.tls_cert_file = cert_;
    c.tls_key_file = key_;
    daemon_ = StartDaemon(c);
    ASSERT_NE(daemon_, nullptr);
    port_ = PortOf(*daemon_);
  }
  void TearDown() override {
    if (daemon_) daemon_->Shutdown(1);
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_, cert_, key_;
  std::unique_ptr<Daemon> daemon_;
  int port_ = 0;
};

TEST_F(HttpTls, OpensslClientGetsHttpsAndPlainHttpGetsNothing) {
  EXPECT_EQ(daemon_->url().rfind("https://", 0), 0u) << daemon_->url();
  std::string out = SClientGet(port_, "/healthz");
  EXPECT_NE(out.find("CN = moeserve-first"), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 200 OK"), std::string::npos) << out;
  EXPECT_NE(out.find("{\"status\":\"ok\"}"), std::string::npos) << out;
  // Plain HTTP on the TLS port is a failed handshake, never an answer.
  auto plain = Http(port_, "GET", "/healthz");
  EXPECT_NE(plain.status, 200);
}

TEST_F(HttpTls, CertificateSwapIsServedWithoutRestart) {
  ASSERT_NE(SClientGet(port_, "/healthz").find("CN = moeserve-first"), std::string::npos);
  MakeCertificate("moeserve-second", cert_, key_);
  // The files are checked at most once a second, on accept.
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    out = SClientGet(port_, "/healthz");
    if (out.find("CN = moeserve-second") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_NE(out.find("CN = moeserve-second"), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 200 OK"), std::string::npos) << out;
  // A broken pair (key of another certificate) keeps the last good one.
  {
    std::string other_cert = dir_ + "/other.crt", other_key = dir_ + "/other.key";
    MakeCertificate("moeserve-other", other_cert, other_key);
    std::filesystem::copy_file(other_key, key_, std::filesystem::copy_options::overwrite_existing);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  out = SClientGet(port_, "/healthz");
  EXPECT_NE(out.find("CN = moeserve-second"), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP/1.1 200 OK"), std::string::npos) << out;
}

TEST_F(HttpTls, OfficialOpenAiClientOverHttps) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  std::string root = src ? src : MOESERVE_SOURCE_DIR_DEFAULT;
  if (std::system("command -v node >/dev/null 2>&1") != 0 ||
      !std::filesystem::exists(root + "/node_modules/openai/package.json")) {
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/setup installs them)";
  }
  // The client trusts the self-signed certificate through NODE_EXTRA_CA_CERTS
  // only: it verifies the chain and the 127.0.0.1 name like any https peer.
  std::string cmd = "cd '" + root + "' && NODE_EXTRA_CA_CERTS='" + cert_ + "' node tests/daemon/openai_client.mjs " +
                    daemon_->url() + "/v1 2>&1; echo \"exit=$?\"";
  std::string out = RunCommand(cmd);
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
}

}  // namespace
}  // namespace moeserve::daemon::testing

// The client's TLS settings against a real TLS peer (openssl s_server, which
// answers any GET with an HTML page): the CA from a kubeconfig verifies the
// server, the client certificate and key authenticate us, and
// insecure-skip-tls-verify skips verification. A response that is "not JSON"
// means the TLS handshake and the HTTP exchange succeeded.
#include "../support/loopback.hpp"
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <fcntl.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "moeserve/operator/kube_client.hpp"

extern char** environ;

namespace moeserve::op {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class KubeTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
    dir_ = fs::temp_directory_path() / ("moe-tls-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const std::string d = dir_.string();
    const std::string script =
        "cd " + d + " && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca 2>/dev/null && "
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1 2>/dev/null && "
        "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile san.ext 2>/dev/null && "
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=moe-operator 2>/dev/null && "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 1 2>/dev/null";
    ASSERT_EQ(system(script.c_str()), 0);
    port_ = test_support::FreeLoopbackPort();
    std::vector<std::string> args = {"/usr/bin/openssl", "s_server", "-quiet", "-accept", std::to_string(port_),
                                     "-cert", d + "/server.pem", "-key", d + "/server.key", "-CAfile", d + "/ca.pem",
                                     "-Verify", "1", "-www"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    ASSERT_EQ(posix_spawn(&server_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  void TearDown() override {
    if (server_ > 0) {
      kill(server_, SIGTERM);
      waitpid(server_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }
  KubeConfig Base() {
    KubeConfig c;
    c.server = "https://127.0.0.1:" + std::to_string(port_);
    c.request_timeout_s = 5;
    return c;
  }
  // Handshake and exchange worked: the page is not JSON.
  static bool Connected(const Result<json>& r) {
    return !r && r.error().message().find("not JSON") != std::string::npos;
  }
  fs::path dir_;
  int port_ = 0;
  pid_t server_ = -1;
};

TEST_F(KubeTls, CaDataAndClientCertificateFromKubeconfig) {
  // Through a kubeconfig file with *-data fields, as kubectl writes them.
  std::string b64 = "base64 -w0 ";
  auto data = [&](const char* file) {
    std::string out;
    FILE* p = popen((b64 + (dir_ / file).string()).c_str(), "r");
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
  };
  std::ofstream(dir_ / "kubeconfig") << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                                     << "clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:" << port_
                                     << "\n    certificate-authority-data: " << data("ca.pem")
                                     << "\nusers:\n- name: u\n  user:\n    client-certificate-data: " << data("client.pem")
                                     << "\n    client-key-data: " << data("client.key")
                                     << "\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n";
  auto config = LoadKubeconfig((dir_ / "kubeconfig").string());
  ASSERT_TRUE(config) << config.error().ToString();
  auto client = KubeClient::Create(*config);
  ASSERT_TRUE(client);
  auto r = (*client)->Get(resources::kNamespace, "", "default");
  EXPECT_TRUE(Connected(r)) << (r ? std::string("got JSON") : r.error().ToString());
}

TEST_F(KubeTls, CaFileVerifiesAndWithoutItVerificationFails) {
  KubeConfig c = Base();
  c.client_cert_file = (dir_ / "client.pem").string();
  c.client_key_file = (dir_ / "client.key").string();
  KubeConfig unverified = c;
  c.ca_file = (dir_ / "ca.pem").string();
  auto ok = (*KubeClient::Create(c))->Get(resources::kNamespace, "", "default");
  EXPECT_TRUE(Connected(ok)) << (ok ? std::string("got JSON") : ok.error().ToString());
  // No CA: the server's certificate cannot be verified.
  auto bad = (*KubeClient::Create(unverified))->Get(resources::kNamespace, "", "default");
  ASSERT_FALSE(bad);
  EXPECT_FALSE(Connected(bad)) << bad.error().ToString();
  // insecure-skip-tls-verify: no verification.
  unverified.insecure_skip_tls_verify = true;
  auto skipped = (*KubeClient::Create(unverified))->Get(resources::kNamespace, "", "default");
  EXPECT_TRUE(Connected(skipped)) << (skipped ? std::string("got JSON") : skipped.error().ToString());
}

TEST_F(KubeTls, ServerRequiringAClientCertificateRefusesUsWithoutOne) {
  KubeConfig c = Base();
  c.ca_file = (dir_ / "ca.pem").string();
  auto r = (*KubeClient::Create(c))->Get(resources::kNamespace, "", "default");
  ASSERT_FALSE(r);
  EXPECT_FALSE(Connected(r)) << r.error().ToString();
}

}  // namespace
}  // namespace moeserve::op

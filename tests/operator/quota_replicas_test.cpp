// Two moe-operator processes with --leader-elect: both serve the quota
// webhook from one Secret (one certificate, created once), renewal at two
// thirds of a short lifetime reaches both, and killing the leader keeps the
// webhook answering (the survivor leads, serves and renews).
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/wait.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "moeserve/common/base64.hpp"
#include "operator_test_util.hpp"
#include "quota_webhook_support.hpp"

namespace moeserve::op::testing {
namespace {

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The certificate a TLS server on 127.0.0.1:port presents (PEM), "" when none.
std::string ServedCertificate(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string pem;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      if (X509* cert = SSL_get1_peer_certificate(ssl)) {
        BIO* bio = BIO_new(BIO_s_mem());
        PEM_write_bio_X509(bio, cert);
        char* data = nullptr;
        const long n = BIO_get_mem_data(bio, &data);
        pem.assign(data, static_cast<size_t>(n));
        BIO_free(bio);
        X509_free(cert);
      }
      SSL_shutdown(ssl);
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  ::close(fd);
  return pem;
}

class QuotaReplicas : public ::testing::Test {
 protected:
  void SetUp() override {
    // ServedCertificate's handshake writes to a replica that may be killed
    // or still starting: a closed socket must be an error, not the end.
    signal(SIGPIPE, SIG_IGN);
    (void)cluster_.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"},
                                                      {"metadata", {{"name", "moeserve-system"}}}});  // FakeCluster may have made it
    kubeconfig_ = std::filesystem::temp_directory_path() / ("moe-quota-replicas-" + std::to_string(getpid()) + ".kc");
    ASSERT_TRUE(cluster_.server.WriteKubeconfig(kubeconfig_.string()));
    client_ = cluster_.Client("quota-test/1");
  }
  void TearDown() override {
    for (auto& [name, pid] : pids_) {
      if (pid <= 0) continue;
      kill(pid, SIGTERM);
      int status = 0;
      waitpid(pid, &status, 0);
    }
    std::filesystem::remove(kubeconfig_);
  }
  void StartReplica(const std::string& identity, int port) {
    pid_t pid = Spawn({OperatorBinary(), "--kubeconfig", kubeconfig_.string(), "--leader-elect",
                       "--leader-election-namespace", "moeserve-system", "--identity", identity,
                       "--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.25",
                       "--metrics-addr", "0", "--health-addr", "0", "--watch-timeout", "5",
                       "--webhook-addr", "127.0.0.1:" + std::to_string(port), "--operator-namespace",
                       "moeserve-system", "--webhook-cert-lifetime-seconds", "9", "--webhook-check-seconds", "0.25"});
    ASSERT_GT(pid, 0);
    pids_[identity] = pid;
  }
  std::string SecretCert() {
    auto s = cluster_.server.Get("secrets", "moeserve-system", "moeserve-webhook-tls");
    return s ? Base64Decode((*s)["data"].value("tls.crt", "")) : "";
  }
  std::string Leader() {
    auto lease = cluster_.server.Get("leases.coordination.k8s.io", "moeserve-system", "moe-operator-leader");
    return lease ? (*lease)["spec"].value("holderIdentity", "") : "";
  }
  // A MoEDeployment past the policy: the webhook must refuse it (403), every time.
  bool Refused() {
    json md = MoEDeploymentManifest("team-a", "too-big", 2, 1);
    md["spec"]["quotaPolicyRef"] = {{"name", "team-a"}};
    auto created = client_->Create(resources::kMoEDeployment, "team-a", md);
    if (created) return false;
    last_error_ = created.error().message();
    return created.error().code() == ErrorCode::kPermissionDenied &&
           last_error_.find("admission webhook \"quota.moeserve.io\" denied the request: QuotaPolicy team-a: "
                            "limits.maxGPUs is 8; this MoEDeployment would bring the namespace to 16") == 0;
  }
  // Calls the webhook until `done`, counting answers that were not the refusal.
  int RefusalsFailedUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    int failed = 0;
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done() && std::chrono::steady_clock::now() < until) {
      if (!Refused()) {
        failed++;
        ADD_FAILURE() << "not refused by the webhook: " << last_error_;
      }
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(done()) << "timed out";
    return failed;
  }

  FakeCluster cluster_;
  std::filesystem::path kubeconfig_;
  std::unique_ptr<KubeClient> client_;
  std::map<std::string, pid_t> pids_;
  std::string last_error_;
};

TEST_F(QuotaReplicas, TwoReplicasServeOneCertificateThroughRenewalAndFailover) {
  ASSERT_TRUE(cluster_.server.Create("validatingwebhookconfigurations.admissionregistration.k8s.io",
                                     QuotaWebhookConfiguration("Fail")));
  const int port_a = FreePort(), port_b = FreePort();
  StartReplica("replica-a", port_a);
  StartReplica("replica-b", port_b);

  // One Secret, made once, served by both.
  ASSERT_TRUE(WaitFor([&] {
    const std::string cert = SecretCert();
    return !cert.empty() && ServedCertificate(port_a) == cert && ServedCertificate(port_b) == cert;
  })) << "both replicas should serve the Secret's certificate";
  int created = 0;
  for (const auto& w : cluster_.server.Writes())
    if (w.method == "POST" && w.path == "/api/v1/namespaces/moeserve-system/secrets" && w.status == 201) created++;
  EXPECT_EQ(created, 1);

  cluster_.server.admission().MapService("moeserve-system", "moeserve-webhook", {port_a, port_b});
  ASSERT_TRUE(cluster_.server.Create("quotapolicies.moeserve.io",
                                     {{"apiVersion", "moeserve.io/v1alpha1"}, {"kind", "QuotaPolicy"},
                                      {"metadata", {{"name", "team-a"}, {"namespace", "team-a"}}},
                                      {"spec", {{"limits", {{"maxGPUs", 8}}}}}}));
  ASSERT_TRUE(WaitFor([&] { return Refused(); })) << last_error_;

  // Renewal at two thirds of 9 s: a new certificate reaches both replicas,
  // and the webhook refuses throughout.
  const std::string first = SecretCert();
  EXPECT_EQ(RefusalsFailedUntil([&] { return SecretCert() != first; }, 15s), 0);
  const std::string renewed = SecretCert();
  EXPECT_EQ(RefusalsFailedUntil([&] { return ServedCertificate(port_a) == renewed && ServedCertificate(port_b) == renewed; }, 5s), 0);

  // Failover: kill the leader; the other takes the lease, and the webhook
  // keeps answering (the dead endpoint refuses connections, the next serves).
  ASSERT_TRUE(WaitFor([&] { return !Leader().empty(); }));
  const std::string leader = Leader();
  ASSERT_TRUE(pids_.count(leader)) << leader;
  kill(pids_[leader], SIGKILL);
  int status = 0;
  waitpid(pids_[leader], &status, 0);
  pids_[leader] = -1;
  const std::string survivor = leader == "replica-a" ? "replica-b" : "replica-a";
  const int survivor_port = survivor == "replica-a" ? port_a : port_b;
  EXPECT_EQ(RefusalsFailedUntil([&] { return Leader() == survivor; }, 10s), 0);
  // The survivor renews on its own next time, and serves what it renewed.
  EXPECT_EQ(RefusalsFailedUntil([&] { return SecretCert() != renewed && ServedCertificate(survivor_port) == SecretCert(); }, 15s), 0);
  // The CA stayed: the bundle the leader wrote still verifies the renewed certificate.
  auto vwc = cluster_.server.Get("validatingwebhookconfigurations.admissionregistration.k8s.io", "", "moeserve-quota");
  ASSERT_TRUE(vwc);
  EXPECT_FALSE((*vwc)["webhooks"][0]["clientConfig"].value("caBundle", "").empty());
  EXPECT_TRUE(Refused()) << last_error_;
}

}  // namespace
}  // namespace moeserve::op::testing

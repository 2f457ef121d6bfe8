// The API double's validating admission (tests/fakes/admission), against a
// real HTTPS webhook (op::WebhookServer): what the review carries for create,
// update and the scale subresource; refusals as kube-apiserver words them;
// the certificate verified against caBundle and the Service's name;
// timeoutSeconds and failurePolicy; and the webhook server's own limits.
#include <openssl/ssl.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "moeserve/common/base64.hpp"
#include "moeserve/operator/admission_server.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

const std::string kVwc = "validatingwebhookconfigurations.admissionregistration.k8s.io";

json Configuration(const std::string& name, const std::string& path, const std::string& ca, const std::string& policy,
                   int timeout_s = 5) {
  return {{"apiVersion", "admissionregistration.k8s.io/v1"},
          {"kind", "ValidatingWebhookConfiguration"},
          {"metadata", {{"name", "test"}}},
          {"webhooks",
           {{{"name", name},
             {"clientConfig",
              {{"caBundle", Base64Encode(ca)},
               {"service", {{"namespace", "hooks"}, {"name", "hook"}, {"path", path}, {"port", 443}}}}},
             {"rules", {{{"apiGroups", {"moeserve.io"}}, {"apiVersions", {"v1alpha1"}},
                         {"resources", {"moedeployments", "moedeployments/scale"}},
                         {"operations", {"CREATE", "UPDATE"}}}}},
             {"failurePolicy", policy},
             {"sideEffects", "None"},
             {"admissionReviewVersions", {"v1"}},
             {"timeoutSeconds", timeout_s}}}}};
}

class AdmissionDouble : public ::testing::Test {
 protected:
  void SetUp() override {
    ca_ = *GenerateCa("test-ca", 3600s);
    auto serving = IssueServingCertificate(ca_, {"hook.hooks.svc"}, 3600s);
    ASSERT_TRUE(serving);
    server_ = std::make_unique<WebhookServer>([this](const std::string& path, std::string_view body) {
      const json review = json::parse(body);
      {
        std::lock_guard lock(mu_);
        reviews_.push_back(review);
      }
      const std::string uid = review["request"]["uid"];
      if (path.rfind("/slow", 0) == 0) std::this_thread::sleep_for(2500ms);
      if (path.rfind("/garbage", 0) == 0) return AdmissionHttpAnswer{200, "{\"response\": 5}"};
      if (path.rfind("/deny", 0) == 0) return AdmissionHttpAnswer{200, AdmissionResponse(uid, false, 403, "no, because").dump()};
      return AdmissionHttpAnswer{200, AdmissionResponse(uid, true).dump()};
    });
    ASSERT_TRUE(server_->SetCertificate(*serving));
    auto port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port);
    port_ = *port;
    ASSERT_TRUE(cluster_.server.Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "hooks"}}}}));
    cluster_.server.admission().MapService("hooks", "hook", {port_});
    client_ = cluster_.Client("admission-test/1");
  }
  void Install(const json& configuration) {
    (void)cluster_.server.Delete(kVwc, "", "test");
    ASSERT_TRUE(cluster_.server.Create(kVwc, configuration));
  }
  Result<json> CreateMd(const std::string& name) {
    return client_->Create(resources::kMoEDeployment, "team-a", MoEDeploymentManifest("team-a", name, 1, 1));
  }
  size_t ReviewCount() {
    std::lock_guard lock(mu_);
    return reviews_.size();
  }
  json LastReview() {
    std::lock_guard lock(mu_);
    return reviews_.empty() ? json() : reviews_.back();
  }

  FakeCluster cluster_;
  KeyPair ca_;
  std::unique_ptr<WebhookServer> server_;
  int port_ = 0;
  std::unique_ptr<KubeClient> client_;
  std::mutex mu_;
  std::vector<json> reviews_;
};

TEST_F(AdmissionDouble, ReviewsCarryTheRequestAndRefusalsAreWordedAsKubeApiserverDoes) {
  Install(Configuration("allow.test", "/allow", ca_.cert_pem, "Fail"));
  ASSERT_TRUE(CreateMd("md"));
  json r = LastReview()["request"];
  EXPECT_EQ(LastReview()["apiVersion"], "admission.k8s.io/v1");
  EXPECT_FALSE(r.value("uid", "").empty());
  EXPECT_EQ(r["operation"], "CREATE");
  EXPECT_EQ(r["kind"], json({{"group", "moeserve.io"}, {"version", "v1alpha1"}, {"kind", "MoEDeployment"}}));
  EXPECT_EQ(r["resource"], json({{"group", "moeserve.io"}, {"version", "v1alpha1"}, {"resource", "moedeployments"}}));
  EXPECT_EQ(r["requestKind"], r["kind"]);
  EXPECT_EQ(r["namespace"], "team-a");
  EXPECT_EQ(r["name"], "md");
  EXPECT_EQ(r["dryRun"], false);
  EXPECT_EQ(r["userInfo"]["username"], "admission-test");
  EXPECT_EQ(r["object"]["spec"]["rollout"]["maxUnavailableReplicas"], 1);  // as it would be stored, defaults applied
  EXPECT_TRUE(r["oldObject"].is_null());

  // The scale subresource: an autoscaling/v1 Scale, old and new.
  ASSERT_TRUE(client_->Patch(resources::kMoEDeployment, "team-a", "md", "application/merge-patch+json",
                             {{"spec", {{"replicas", 3}}}}, "scale"));
  r = LastReview()["request"];
  EXPECT_EQ(r["operation"], "UPDATE");
  EXPECT_EQ(r["subResource"], "scale");
  EXPECT_EQ(r["kind"]["kind"], "Scale");
  EXPECT_EQ(r["object"]["spec"]["replicas"], 3);
  EXPECT_EQ(r["oldObject"]["spec"]["replicas"], 1);

  // Refused: 403 with the webhook's message, and nothing written.
  Install(Configuration("deny.test", "/deny", ca_.cert_pem, "Fail"));
  auto denied = CreateMd("md2");
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(denied.error().message(), "admission webhook \"deny.test\" denied the request: no, because");
  EXPECT_FALSE(cluster_.server.Get("moedeployments.moeserve.io", "team-a", "md2"));
  // Status writes are not sent (the rules name no status subresource).
  const size_t before = ReviewCount();
  ASSERT_TRUE(cluster_.server.Get("moedeployments.moeserve.io", "team-a", "md"));
  json md = *client_->Get(resources::kMoEDeployment, "team-a", "md");
  md["status"] = {{"phase", "Pending"}};
  ASSERT_TRUE(client_->UpdateStatus(resources::kMoEDeployment, md));
  EXPECT_EQ(ReviewCount(), before);
}

TEST_F(AdmissionDouble, TheCertificateIsVerifiedAgainstTheCaBundleAndTheServiceName) {
  auto other = GenerateCa("other-ca", 3600s);
  Install(Configuration("allow.test", "/allow", other->cert_pem, "Fail"));
  auto refused = CreateMd("md");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kUnavailable);  // 500
  EXPECT_NE(refused.error().message().find("Internal error occurred: failed calling webhook \"allow.test\": failed "
                                           "to call webhook: Post \"https://hook.hooks.svc:443/allow?timeout=5s\""),
            std::string::npos)
      << refused.error().message();
  EXPECT_NE(refused.error().message().find("failed to verify certificate"), std::string::npos);

  // The right CA, but a Service whose name the certificate does not carry.
  json wrong_name = Configuration("allow.test", "/allow", ca_.cert_pem, "Fail");
  wrong_name["webhooks"][0]["clientConfig"]["service"]["name"] = "other";
  cluster_.server.admission().MapService("hooks", "other", {port_});
  Install(wrong_name);
  auto mismatch = CreateMd("md");
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().message().find("failed to verify certificate"), std::string::npos)
      << mismatch.error().message();

  // Ignore lets the write through when the call fails.
  Install(Configuration("allow.test", "/allow", other->cert_pem, "Ignore"));
  EXPECT_TRUE(CreateMd("md"));
}

TEST_F(AdmissionDouble, TimeoutsAndUnreadableAnswersFollowFailurePolicy) {
  Install(Configuration("slow.test", "/slow", ca_.cert_pem, "Fail", 1));
  auto timed_out = CreateMd("md");
  ASSERT_FALSE(timed_out);
  EXPECT_NE(timed_out.error().message().find("failed calling webhook \"slow.test\""), std::string::npos);
  EXPECT_NE(timed_out.error().message().find("context deadline exceeded"), std::string::npos)
      << timed_out.error().message();
  Install(Configuration("slow.test", "/slow", ca_.cert_pem, "Ignore", 1));
  EXPECT_TRUE(CreateMd("md"));

  Install(Configuration("garbage.test", "/garbage", ca_.cert_pem, "Fail"));
  auto garbage = CreateMd("md2");
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().message().find("expected response.allowed to be set"), std::string::npos)
      << garbage.error().message();

  // No endpoint at all.
  cluster_.server.admission().MapService("hooks", "hook", {});
  Install(Configuration("allow.test", "/allow", ca_.cert_pem, "Fail"));
  auto nowhere = CreateMd("md3");
  ASSERT_FALSE(nowhere);
  EXPECT_NE(nowhere.error().message().find("service \"hook\" not found"), std::string::npos) << nowhere.error().message();
}

// Raw bytes to the webhook server over TLS; the response's status line.
std::string RawExchange(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      SSL_write(ssl, request.data(), static_cast<int>(request.size()));
      char buf[4096];
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) out.assign(buf, static_cast<size_t>(n));
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
  }
  ::close(fd);
  return out.substr(0, out.find("\r\n"));
}

TEST_F(AdmissionDouble, TheWebhookServerRefusesOversizedBodiesAndOtherMethods) {
  const size_t too_big = kMaxAdmissionReviewBytes + 1;
  EXPECT_EQ(RawExchange(port_, "POST /allow HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(too_big) +
                                   "\r\n\r\n{"),
            "HTTP/1.1 413 Payload Too Large");
  EXPECT_EQ(RawExchange(port_, "GET /allow HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(RawExchange(port_, "POST /allow HTTP/1.1\r\nHost: x\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"),
            "HTTP/1.1 413 Payload Too Large");
}

}  // namespace
}  // namespace moeserve::op::testing

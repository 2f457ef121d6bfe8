// The set-up every "kubectl through the quota webhook" test shares: the API
// double, a running operator whose webhook the double calls (its Service
// moeserve-system/moeserve-webhook mapped to the webhook's port), the real
// kubectl against the double, and the webhook's configuration with the CA
// bundle the leader writes into it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "operator_test_util.hpp"
#include "quota_webhook_support.hpp"

namespace moeserve::op::testing {

inline const std::string kValidatingWebhookConfigurations =
    "validatingwebhookconfigurations.admissionregistration.k8s.io";

class WebhookKubectlTest : public ::testing::Test {
 protected:
  // Starts the operator with `options` (two workers, the webhook on loopback
  // in moeserve-system) and kubectl. The caller skips first where kubectl is
  // missing (GTEST_SKIP only leaves the function it is in); failures are
  // fatal, so a caller checks HasFatalFailure() before going on.
  void StartOperator(OperatorOptions options = {}) {
    client_ = cluster_.Client();
    options.workers = 2;
    options.webhook.addr = "127.0.0.1:0";
    options.webhook.operator_namespace = "moeserve-system";
    options.webhook.check_interval = std::chrono::milliseconds(200);
    op_ = std::make_unique<RunningOperator>(*client_, options);
    ASSERT_TRUE(WaitFor([&] {
      auto* w = op_->op.quota().webhook();
      return w && w->port() > 0 && !w->ServedCertificate().empty();
    })) << "the webhook never served a certificate";
    port_ = op_->op.quota().webhook()->port();
    cluster_.server.admission().MapService("moeserve-system", "moeserve-webhook", {port_});
    kubectl_ = std::make_unique<Kubectl>(cluster_.server);
  }
  // Installs the configuration and waits for the leader to write the CA bundle into it.
  void InstallWebhook(const std::string& failure_policy = "Fail") {
    ASSERT_TRUE(cluster_.server.Create(kValidatingWebhookConfigurations, QuotaWebhookConfiguration(failure_policy)));
    ASSERT_TRUE(WaitFor([&] {
      auto vwc = cluster_.server.Get(kValidatingWebhookConfigurations, "", "moeserve-quota");
      return vwc && (*vwc)["webhooks"][0]["clientConfig"].contains("caBundle");
    })) << "the leader never wrote the CA bundle";
  }
  void TearDown() override {
    if (op_) op_->Stop();
  }

  FakeCluster cluster_;
  std::unique_ptr<KubeClient> client_;
  std::unique_ptr<RunningOperator> op_;
  std::unique_ptr<Kubectl> kubectl_;
  int port_ = 0;
};

}  // namespace moeserve::op::testing

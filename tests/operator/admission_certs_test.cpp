// The webhook's CA and serving certificate: made with the Service's names,
// verified against the right CA and key only, due for renewal at two thirds
// of their lifetime.
#include <gtest/gtest.h>

#include "moeserve/operator/admission_certs.hpp"

namespace moeserve::op {
namespace {

using namespace std::chrono_literals;

TEST(AdmissionCerts, TheServingCertificateNamesTheServiceAndChainsToTheCa) {
  auto ca = GenerateCa("moeserve-webhook-ca", std::chrono::hours(24 * 3650));
  ASSERT_TRUE(ca) << ca.error().ToString();
  const std::vector<std::string> names = {"moeserve-webhook.moeserve-system.svc",
                                          "moeserve-webhook.moeserve-system.svc.cluster.local"};
  auto serving = IssueServingCertificate(*ca, names, std::chrono::hours(24 * 365));
  ASSERT_TRUE(serving) << serving.error().ToString();
  auto info = ReadCertificate(serving->cert_pem);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->dns_names, names);
  EXPECT_FALSE(info->is_ca);
  EXPECT_TRUE(ReadCertificate(ca->cert_pem)->is_ca);
  const auto lifetime = std::chrono::duration_cast<std::chrono::hours>(info->not_after - info->not_before);
  EXPECT_GE(lifetime.count(), 24 * 365);
  EXPECT_LE(lifetime.count(), 24 * 365 + 1);
  EXPECT_TRUE(VerifyKeyPair(serving->cert_pem, serving->key_pem, ca->cert_pem));
}

TEST(AdmissionCerts, AnotherCaOrAnotherKeyIsRefused) {
  auto ca = GenerateCa("ca", 3600s);
  auto other_ca = GenerateCa("other", 3600s);
  ASSERT_TRUE(ca && other_ca);
  auto serving = IssueServingCertificate(*ca, {"svc.ns.svc"}, 3600s);
  auto other = IssueServingCertificate(*ca, {"svc.ns.svc"}, 3600s);
  ASSERT_TRUE(serving && other);
  auto wrong_ca = VerifyKeyPair(serving->cert_pem, serving->key_pem, other_ca->cert_pem);
  ASSERT_FALSE(wrong_ca);
  EXPECT_NE(wrong_ca.error().message().find("not signed"), std::string::npos);
  auto wrong_key = VerifyKeyPair(serving->cert_pem, other->key_pem, ca->cert_pem);
  ASSERT_FALSE(wrong_key);
  EXPECT_NE(wrong_key.error().message().find("tls.key"), std::string::npos);
  // A bundle holding the old and the new CA verifies certificates of either.
  EXPECT_TRUE(VerifyKeyPair(serving->cert_pem, serving->key_pem, other_ca->cert_pem + ca->cert_pem));
  EXPECT_FALSE(ReadCertificate("not a certificate"));
  EXPECT_FALSE(VerifyKeyPair("junk", serving->key_pem, ca->cert_pem));
}

TEST(AdmissionCerts, RenewalIsDueAtTwoThirdsOfTheLifetime) {
  auto ca = GenerateCa("ca", 3600s);
  ASSERT_TRUE(ca);
  auto info = ReadCertificate(ca->cert_pem);
  ASSERT_TRUE(info);
  const auto life = info->not_after - info->not_before;
  EXPECT_FALSE(RenewalDue(*info, info->not_before + life / 2));
  EXPECT_FALSE(RenewalDue(*info, info->not_before + life * 2 / 3 - 1s));
  EXPECT_TRUE(RenewalDue(*info, info->not_before + life * 2 / 3));
  EXPECT_TRUE(RenewalDue(*info, info->not_after + 1s));
}

}  // namespace
}  // namespace moeserve::op

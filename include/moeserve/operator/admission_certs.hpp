// The webhook's CA and serving certificate, made with OpenSSL: ECDSA P-256
// keys, SHA-256 signatures, PEM text. The CA signs the serving certificate,
// whose subjectAltNames are the Service's DNS names
// (<service>.<ns>.svc, <service>.<ns>.svc.cluster.local); the API server
// verifies the webhook against the CA (the caBundle).
//
// Renewal: a certificate is due at two thirds of its lifetime
// (RenewalDue), well before it expires.
//
// Thread safety: free functions; OpenSSL 3 is thread-safe for these calls.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct KeyPair {
  std::string cert_pem, key_pem;
};

struct CertificateInfo {
  std::chrono::system_clock::time_point not_before, not_after;
  std::vector<std::string> dns_names;  // subjectAltName DNS entries
  bool is_ca = false;
};

// A self-signed CA valid from now for `lifetime`.
Result<KeyPair> GenerateCa(const std::string& common_name, std::chrono::seconds lifetime);
// A serving certificate for `dns_names` signed by the CA (PEM pair).
Result<KeyPair> IssueServingCertificate(const KeyPair& ca, const std::vector<std::string>& dns_names,
                                        std::chrono::seconds lifetime);
// The first certificate in `pem`. Errors: InvalidArgument.
Result<CertificateInfo> ReadCertificate(const std::string& pem);
// Whether `cert_pem` is signed by one of the certificates in `ca_pem` and
// `key_pem` is its private key. Errors: InvalidArgument saying which check failed.
Status VerifyKeyPair(const std::string& cert_pem, const std::string& key_pem, const std::string& ca_pem);
// now is at or past two thirds of the certificate's lifetime.
bool RenewalDue(const CertificateInfo& info, std::chrono::system_clock::time_point now);

}  // namespace moeserve::op

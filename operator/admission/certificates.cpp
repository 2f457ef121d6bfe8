#include "moeserve/operator/admission_certs.hpp"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

namespace moeserve::op {
namespace {

template <class T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

std::string OpenSslError(const std::string& what) {
  const unsigned long e = ERR_get_error();
  char buf[256] = {0};
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return what + (e ? std::string(": ") + buf : "");
}

Result<Pkey> NewKey() {
  Pkey key(EVP_EC_gen("P-256"));
  if (!key) return Fail(Error::Internal(OpenSslError("generating a P-256 key")));
  return key;
}

std::string ToPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string ToPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Result<Cert> CertFromPem(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return Fail(Error::InvalidArgument(OpenSslError("not a PEM certificate")));
  return cert;
}

Result<Pkey> KeyFromPem(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Pkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return Fail(Error::InvalidArgument(OpenSslError("not a PEM private key")));
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return Fail(Error::Internal(OpenSslError("certificate extension " + value)));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return Fail(Error::Internal(OpenSslError("adding extension " + value)));
  return Ok();
}

// A certificate for `key` named `common_name`, valid from now for `lifetime`.
// Backdated by a tenth of the lifetime (at most 5 minutes) for clock skew
// between this replica and the API server.
Result<Cert> NewCertificate(EVP_PKEY* key, const std::string& common_name, std::chrono::seconds lifetime) {
  Cert cert(X509_new());
  if (!cert) return Fail(Error::Internal(OpenSslError("X509_new")));
  X509_set_version(cert.get(), 2);
  std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>> serial(BN_new());
  BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get()));
  const long skew = static_cast<long>(std::min<int64_t>(300, lifetime.count() / 10));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -skew);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(lifetime.count()));
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()),
                             -1, -1, 0);
  if (X509_set_pubkey(cert.get(), key) != 1) return Fail(Error::Internal(OpenSslError("X509_set_pubkey")));
  return cert;
}

std::chrono::system_clock::time_point ToTimePoint(const ASN1_TIME* t) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return {};
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

}  // namespace

Result<KeyPair> GenerateCa(const std::string& common_name, std::chrono::seconds lifetime) {
  MOE_ASSIGN_OR_RETURN(Pkey key, NewKey());
  MOE_ASSIGN_OR_RETURN(Cert cert, NewCertificate(key.get(), common_name, lifetime));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  MOE_TRY(AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE"));
  MOE_TRY(AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  MOE_TRY(AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) return Fail(Error::Internal(OpenSslError("signing the CA")));
  return KeyPair{ToPem(cert.get()), ToPem(key.get())};
}

Result<KeyPair> IssueServingCertificate(const KeyPair& ca, const std::vector<std::string>& dns_names,
                                        std::chrono::seconds lifetime) {
  if (dns_names.empty()) return Fail(Error::InvalidArgument("a serving certificate needs at least one DNS name"));
  MOE_ASSIGN_OR_RETURN(Cert ca_cert, CertFromPem(ca.cert_pem));
  MOE_ASSIGN_OR_RETURN(Pkey ca_key, KeyFromPem(ca.key_pem));
  MOE_ASSIGN_OR_RETURN(Pkey key, NewKey());
  MOE_ASSIGN_OR_RETURN(Cert cert, NewCertificate(key.get(), dns_names.front(), lifetime));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  std::string san;
  for (const auto& n : dns_names) san += (san.empty() ? "DNS:" : ",DNS:") + n;
  MOE_TRY(AddExtension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  MOE_TRY(AddExtension(cert.get(), ca_cert.get(), NID_key_usage, "critical,digitalSignature"));
  MOE_TRY(AddExtension(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth"));
  MOE_TRY(AddExtension(cert.get(), ca_cert.get(), NID_subject_alt_name, san));
  MOE_TRY(AddExtension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) <= 0)
    return Fail(Error::Internal(OpenSslError("signing the serving certificate")));
  return KeyPair{ToPem(cert.get()), ToPem(key.get())};
}

Result<CertificateInfo> ReadCertificate(const std::string& pem) {
  MOE_ASSIGN_OR_RETURN(Cert cert, CertFromPem(pem));
  CertificateInfo info;
  info.not_before = ToTimePoint(X509_get0_notBefore(cert.get()));
  info.not_after = ToTimePoint(X509_get0_notAfter(cert.get()));
  info.is_ca = X509_check_ca(cert.get()) > 0;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (names) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
      if (n->type != GEN_DNS) continue;
      const unsigned char* data = ASN1_STRING_get0_data(n->d.dNSName);
      info.dns_names.emplace_back(reinterpret_cast<const char*>(data),
                                  static_cast<size_t>(ASN1_STRING_length(n->d.dNSName)));
    }
    GENERAL_NAMES_free(names);
  }
  return info;
}

Status VerifyKeyPair(const std::string& cert_pem, const std::string& key_pem, const std::string& ca_pem) {
  MOE_ASSIGN_OR_RETURN(Cert cert, CertFromPem(cert_pem));
  MOE_ASSIGN_OR_RETURN(Pkey key, KeyFromPem(key_pem));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return Fail(Error::InvalidArgument("tls.key is not the key of tls.crt"));
  }
  // Every certificate in the bundle is a candidate issuer.
  Bio bio(BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())));
  bool any = false;
  while (Cert ca{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) {
    any = true;
    Pkey ca_key(X509_get_pubkey(ca.get()));
    if (ca_key && X509_verify(cert.get(), ca_key.get()) == 1) {
      ERR_clear_error();
      return Ok();
    }
  }
  ERR_clear_error();
  return Fail(Error::InvalidArgument(any ? "tls.crt is not signed by a certificate in ca.crt" : "ca.crt holds no certificate"));
}

bool RenewalDue(const CertificateInfo& info, std::chrono::system_clock::time_point now) {
  const auto lifetime = info.not_after - info.not_before;
  return now >= info.not_before + lifetime * 2 / 3;
}

}  // namespace moeserve::op

// beast_setup.server_setup: what the daemon's HTTP front and the operator's
// webhook take from beast_setup. A TLS context accepts a matching PEM pair
// (as text or from files) with TLS 1.0/1.1 and compression off, and refuses
// a bad certificate, a bad key and a key of another certificate, each as its
// own step; Listen opens a reusable listening socket and reports the step's
// error (a port already taken).
#include "moeserve/beast_setup/server_setup.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

namespace moeserve::beast_setup {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Step = TlsSetupError::Step;

struct Pem {
  std::string cert, key;
};

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

// A self-signed P-256 certificate for "localhost", valid for a day.
Pem SelfSigned() {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  EXPECT_TRUE(key && cert);
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  EXPECT_GT(X509_sign(cert.get(), key.get(), EVP_sha256()), 0);
  std::unique_ptr<BIO, decltype(&BIO_free)> c(BIO_new(BIO_s_mem()), BIO_free), k(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(c.get(), cert.get());
  PEM_write_bio_PrivateKey(k.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return {BioText(c.get()), BioText(k.get())};
}

TEST(ServerTlsContext, AMatchingPairGivesAContextWithOnlyTls12AndUp) {
  const Pem pem = SelfSigned();
  auto ctx = ServerTlsContext(PemInput::Text(pem.cert), PemInput::Text(pem.key));
  ASSERT_TRUE(ctx) << ctx.error().detail;
  const uint64_t options = SSL_CTX_get_options((*ctx)->native_handle());
  EXPECT_TRUE(options & SSL_OP_NO_TLSv1);
  EXPECT_TRUE(options & SSL_OP_NO_TLSv1_1);
  EXPECT_TRUE(options & SSL_OP_NO_COMPRESSION);
  EXPECT_NE(SSL_CTX_get0_certificate((*ctx)->native_handle()), nullptr);
}

TEST(ServerTlsContext, FilesAreReadAsThePemTheyHold) {
  const Pem pem = SelfSigned();
  const std::filesystem::path dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::ofstream(dir / "cert.pem") << pem.cert;
  std::ofstream(dir / "key.pem") << pem.key;
  auto ctx = ServerTlsContext(PemInput::File((dir / "cert.pem").string()), PemInput::File((dir / "key.pem").string()));
  EXPECT_TRUE(ctx) << (ctx ? "" : ctx.error().detail);
  auto missing = ServerTlsContext(PemInput::File((dir / "absent.pem").string()), PemInput::File((dir / "key.pem").string()));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().step, Step::kCertificate);
}

TEST(ServerTlsContext, EachBadInputIsRefusedAtItsOwnStep) {
  const Pem a = SelfSigned(), b = SelfSigned();
  auto bad_cert = ServerTlsContext(PemInput::Text("not a certificate"), PemInput::Text(a.key));
  ASSERT_FALSE(bad_cert);
  EXPECT_EQ(bad_cert.error().step, Step::kCertificate);
  EXPECT_FALSE(bad_cert.error().detail.empty());
  auto bad_key = ServerTlsContext(PemInput::Text(a.cert), PemInput::Text("-----BEGIN PRIVATE KEY-----\nAAAA\n"));
  ASSERT_FALSE(bad_key);
  EXPECT_EQ(bad_key.error().step, Step::kKey);
  // A well-formed key of another certificate of the same type: OpenSSL
  // refuses it as the key is loaded.
  auto other = ServerTlsContext(PemInput::Text(a.cert), PemInput::Text(b.key));
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().step, Step::kKey) << other.error().detail;
  // A key of another type loads beside the certificate; the final check
  // finds that no certificate goes with it.
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> rsa(EVP_RSA_gen(2048), EVP_PKEY_free);
  ASSERT_TRUE(rsa);
  std::unique_ptr<BIO, decltype(&BIO_free)> k(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(k.get(), rsa.get(), nullptr, nullptr, 0, nullptr, nullptr);
  auto mismatch = ServerTlsContext(PemInput::Text(a.cert), PemInput::Text(BioText(k.get())));
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().step, Step::kMismatch) << mismatch.error().detail;
}

// The form both servers call: each names its inputs its own way.
TEST(ServerTlsContext, TheStatusFormNamesTheInputsAsTheCallerDoes) {
  const Pem a = SelfSigned(), b = SelfSigned();
  auto ok = ServerTlsContext(PemInput::Text(a.cert), "webhook certificate", PemInput::Text(a.key), "webhook key");
  EXPECT_TRUE(ok) << (ok ? "" : ok.error().message());
  auto cert = ServerTlsContext(PemInput::File("/nonexistent/tls.crt"), "TLS certificate /nonexistent/tls.crt",
                               PemInput::Text(a.key), "TLS key k.pem");
  ASSERT_FALSE(cert);
  EXPECT_EQ(cert.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(cert.error().message().rfind("TLS certificate /nonexistent/tls.crt: ", 0), 0u) << cert.error().message();
  auto key = ServerTlsContext(PemInput::Text(a.cert), "webhook certificate", PemInput::Text(b.key), "webhook key");
  ASSERT_FALSE(key);
  EXPECT_EQ(key.error().message().rfind("webhook key: ", 0), 0u) << key.error().message();
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> rsa(EVP_RSA_gen(2048), EVP_PKEY_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> k(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PrivateKey(k.get(), rsa.get(), nullptr, nullptr, 0, nullptr, nullptr);
  auto mismatch =
      ServerTlsContext(PemInput::Text(a.cert), "webhook certificate", PemInput::Text(BioText(k.get())), "webhook key");
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().message(), "webhook key does not match webhook certificate");
}

TEST(Listen, OpensAReusableListenerAndReportsATakenPort) {
  asio::io_context io;
  tcp::acceptor first(io);
  ASSERT_FALSE(Listen(first, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0), 16));
  EXPECT_TRUE(first.is_open());
  asio::socket_base::reuse_address reuse;
  first.get_option(reuse);
  EXPECT_TRUE(reuse.value());
  const tcp::endpoint bound = first.local_endpoint();
  EXPECT_NE(bound.port(), 0);
  // It listens: a client connects.
  tcp::socket client(io);
  boost::system::error_code ec;
  client.connect(bound, ec);
  EXPECT_FALSE(ec) << ec.message();
  // A second listener on the same port fails with the system's reason.
  tcp::acceptor second(io);
  const boost::system::error_code taken = Listen(second, bound, 16);
  EXPECT_EQ(taken, asio::error::address_in_use) << taken.message();
}

}  // namespace
}  // namespace moeserve::beast_setup

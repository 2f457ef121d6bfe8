#include "moeserve/beast_setup/server_setup.hpp"

#include <openssl/ssl.h>

namespace moeserve::beast_setup {

namespace ssl = boost::asio::ssl;

std::expected<std::shared_ptr<ssl::context>, TlsSetupError> ServerTlsContext(const PemInput& certificate,
                                                                             const PemInput& key) {
  using Step = TlsSetupError::Step;
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  // TLS 1.2 and 1.3 only; no compression, no renegotiation-era protocols.
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                       ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::no_compression |
                       ssl::context::single_dh_use,
                   ec);
  if (ec) return std::unexpected(TlsSetupError{Step::kOptions, ec.message()});
  if (certificate.is_file)
    ctx->use_certificate_chain_file(certificate.value, ec);
  else
    ctx->use_certificate_chain(boost::asio::buffer(certificate.value), ec);
  if (ec) return std::unexpected(TlsSetupError{Step::kCertificate, ec.message()});
  if (key.is_file)
    ctx->use_private_key_file(key.value, ssl::context::pem, ec);
  else
    ctx->use_private_key(boost::asio::buffer(key.value), ssl::context::pem, ec);
  if (ec) return std::unexpected(TlsSetupError{Step::kKey, ec.message()});
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) return std::unexpected(TlsSetupError{Step::kMismatch, ""});
  return ctx;
}

Result<std::shared_ptr<ssl::context>> ServerTlsContext(const PemInput& certificate, std::string_view certificate_name,
                                                       const PemInput& key, std::string_view key_name) {
  auto ctx = ServerTlsContext(certificate, key);
  if (ctx) return *ctx;
  const std::string cert(certificate_name), k(key_name), why = ctx.error().detail;
  switch (ctx.error().step) {
    case TlsSetupError::Step::kOptions: return Fail(Error::Internal("TLS options: " + why));
    case TlsSetupError::Step::kCertificate: return Fail(Error::InvalidArgument(cert + ": " + why));
    case TlsSetupError::Step::kKey: return Fail(Error::InvalidArgument(k + ": " + why));
    case TlsSetupError::Step::kMismatch: break;
  }
  return Fail(Error::InvalidArgument(k + " does not match " + cert));
}

boost::system::error_code Listen(boost::asio::ip::tcp::acceptor& acceptor,
                                 const boost::asio::ip::tcp::endpoint& endpoint, int backlog) {
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(boost::asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(backlog, ec);
  return ec;
}

}  // namespace moeserve::beast_setup

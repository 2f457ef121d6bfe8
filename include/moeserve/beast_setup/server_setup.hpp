// The setup the tree's two Boost.Beast servers share: the daemon's HTTP
// front (daemon/http/http_server.cpp) and the operator's admission webhook
// (operator/admission/webhook_server.cpp). Each keeps its own connection
// handling (the daemon's is asynchronous with limits and streaming, the
// webhook's a thread per connection); what they set up alike is here:
//
//   ServerTlsContext  a TLS server context: TLS 1.2 and 1.3 only, no
//                     compression, the certificate chain and its private key,
//                     checked to belong together.
//   Listen            open, SO_REUSEADDR, bind and listen on an endpoint.
//
// Errors come back as the step that failed plus OpenSSL's or the system's
// words; the Status form of ServerTlsContext words them with the names each
// server gives its inputs (its files, its settings). names.hpp holds the
// Boost headers and namespace names both servers are written in.
//
// Thread safety: pure functions over the objects passed in.
#pragma once

#include <expected>
#include <memory>
#include <string>
#include <utility>

#include <string_view>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::beast_setup {

// A certificate chain or a key: the PEM text itself, or a file holding it.
struct PemInput {
  static PemInput Text(std::string pem) { return {false, std::move(pem)}; }
  static PemInput File(std::string path) { return {true, std::move(path)}; }
  bool is_file = false;
  std::string value;  // the PEM text, or the file's path
};

struct TlsSetupError {
  enum class Step { kOptions, kCertificate, kKey, kMismatch } step;
  std::string detail;  // OpenSSL's words ("" for kMismatch)
};

std::expected<std::shared_ptr<boost::asio::ssl::context>, TlsSetupError> ServerTlsContext(const PemInput& certificate,
                                                                                           const PemInput& key);

// The same, with a refusal as a Status naming the inputs as the caller calls
// them (certificate_name "TLS certificate /etc/tls/tls.crt", key_name
// "webhook key"): kInvalidArgument "<certificate_name>: <why>",
// "<key_name>: <why>" or "<key_name> does not match <certificate_name>";
// options this OpenSSL refuses are kInternal "TLS options: <why>".
Result<std::shared_ptr<boost::asio::ssl::context>> ServerTlsContext(const PemInput& certificate,
                                                                    std::string_view certificate_name,
                                                                    const PemInput& key, std::string_view key_name);

// Opens `acceptor` on `endpoint`'s protocol with SO_REUSEADDR, binds and
// listens with `backlog`; the first error stops it and is returned.
boost::system::error_code Listen(boost::asio::ip::tcp::acceptor& acceptor,
                                 const boost::asio::ip::tcp::endpoint& endpoint, int backlog);

}  // namespace moeserve::beast_setup

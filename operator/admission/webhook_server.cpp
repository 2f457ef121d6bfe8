#include "moeserve/operator/admission_server.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <boost/beast/ssl.hpp>

#include "moeserve/beast_setup/names.hpp"
#include "moeserve/beast_setup/server_setup.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::op {

using namespace beast_setup::names;

namespace {
constexpr int kMaxConnections = 64;
constexpr int kReadTimeoutS = 10;
constexpr int kIdleTimeoutS = 30;

void SetTimeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}
}  // namespace

struct WebhookServer::Impl {
  Handler handler;
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::shared_ptr<ssl::context> tls;
  std::string cert_pem;
  struct Connection {
    std::thread thread;
    int fd = -1;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Connection> connections;

  std::shared_ptr<ssl::context> CurrentTls() const {
    std::lock_guard lock(mu);
    return tls;
  }

  void Serve(tcp::socket socket, std::shared_ptr<ssl::context> ctx, WebhookServer* owner) {
    const int fd = socket.native_handle();
    SetTimeouts(fd, kReadTimeoutS);
    // An answer leaves as several TLS records; Nagle would hold the last
    // one back until the caller's delayed ACK.
    boost::system::error_code nodelay_ec;
    socket.set_option(tcp::no_delay(true), nodelay_ec);
    boost::system::error_code ec;
    ssl::stream<tcp::socket> stream(std::move(socket), *ctx);
    stream.handshake(ssl::stream_base::server, ec);
    if (ec) return;
    beast::flat_buffer buffer;
    while (!stopping) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(16 * 1024);
      parser.body_limit(kMaxAdmissionReviewBytes);
      bhttp::read(stream, buffer, parser, ec);
      if (ec) {
        if (ec == bhttp::error::body_limit || ec == bhttp::error::header_limit) {
          bhttp::response<bhttp::string_body> too_big{bhttp::status::payload_too_large, 11};
          too_big.set(bhttp::field::content_type, "text/plain");
          too_big.body() = "request larger than the webhook accepts (" +
                           std::to_string(kMaxAdmissionReviewBytes) + " bytes of body)";
          too_big.keep_alive(false);
          too_big.prepare_payload();
          bhttp::write(stream, too_big, ec);
        }
        break;
      }
      const auto& req = parser.get();
      owner->requests_++;
      bhttp::response<bhttp::string_body> res;
      res.version(req.version());
      res.keep_alive(req.keep_alive());
      if (req.method() != bhttp::verb::post) {
        res.result(bhttp::status::method_not_allowed);
        res.set(bhttp::field::content_type, "text/plain");
        res.body() = "only POST is served";
      } else {
        AdmissionHttpAnswer answer;
        try {
          answer = handler(std::string(req.target()), req.body());
        } catch (const std::exception& e) {
          // The boundary: one bad request fails alone.
          answer = {500, json({{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"}, {"code", 500},
                               {"message", std::string("webhook failed: ") + e.what()}})
                             .dump(-1, ' ', false, json::error_handler_t::replace)};
        }
        res.result(static_cast<unsigned>(answer.http_status));
        res.set(bhttp::field::content_type, "application/json");
        res.body() = std::move(answer.body);
      }
      res.prepare_payload();
      bhttp::write(stream, res, ec);
      if (ec || !res.keep_alive()) break;
      SetTimeouts(fd, kIdleTimeoutS);
    }
    stream.shutdown(ec);
  }

  void Reap(bool all) {
    std::vector<Connection> finished;
    {
      std::lock_guard lock(mu);
      for (auto it = connections.begin(); it != connections.end();) {
        if (all || *it->done) {
          if (all) ::shutdown(it->fd, SHUT_RDWR);
          finished.push_back(std::move(*it));
          it = connections.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : finished)
      if (c.thread.joinable()) c.thread.join();
  }

  void AcceptLoop(WebhookServer* owner) {
    while (!stopping) {
      pollfd p{acceptor->native_handle(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      Reap(false);
      bool full = false;
      {
        std::lock_guard lock(mu);
        // Without a certificate nothing can be served: callers wait in the
        // backlog (their own timeout applies) rather than being cut off.
        full = connections.size() >= kMaxConnections || !tls;
      }
      if (full) {
        // The backlog holds the rest; wait for a connection to finish (or a
        // certificate) rather than spin on a listener that stays readable.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      boost::system::error_code ec;
      tcp::socket socket(io);
      acceptor->accept(socket, ec);
      if (ec) continue;
      auto ctx = CurrentTls();
      auto done = std::make_shared<std::atomic<bool>>(false);
      const int fd = socket.native_handle();
      std::lock_guard lock(mu);
      connections.push_back({std::thread([this, owner, s = std::move(socket), ctx, done]() mutable {
                               Serve(std::move(s), ctx, owner);
                               *done = true;
                             }),
                             fd, done});
    }
  }
};

WebhookServer::WebhookServer(Handler handler) : impl_(std::make_unique<Impl>()) { impl_->handler = std::move(handler); }

WebhookServer::~WebhookServer() { Stop(); }

Result<int> WebhookServer::Start(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos) return Fail(Error::InvalidArgument("webhook address " + addr + ": want host:port or :port"));
  const std::string host = colon == 0 ? "0.0.0.0" : addr.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(addr.substr(colon + 1));
  } catch (...) {
    return Fail(Error::InvalidArgument("webhook address " + addr + ": bad port"));
  }
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec) return Fail(Error::Unavailable("webhook listener on " + addr + ": " + ec.message()));
  impl_->acceptor = std::make_unique<tcp::acceptor>(impl_->io);
  ec = beast_setup::Listen(*impl_->acceptor, tcp::endpoint(ip, static_cast<unsigned short>(port)), 256);
  if (ec) return Fail(Error::Unavailable("webhook listener on " + addr + ": " + ec.message()));
  const int bound = impl_->acceptor->local_endpoint().port();
  impl_->accept_thread = std::thread([this] { impl_->AcceptLoop(this); });
  return bound;
}

void WebhookServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  impl_->Reap(true);
  boost::system::error_code ec;
  if (impl_->acceptor) impl_->acceptor->close(ec);
}

Status WebhookServer::SetCertificate(const KeyPair& pair) {
  MOE_ASSIGN_OR_RETURN(auto ctx, beast_setup::ServerTlsContext(beast_setup::PemInput::Text(pair.cert_pem),
                                                                "webhook certificate",
                                                                beast_setup::PemInput::Text(pair.key_pem), "webhook key"));
  std::lock_guard lock(impl_->mu);
  impl_->tls = std::move(ctx);
  impl_->cert_pem = pair.cert_pem;
  return Ok();
}

std::string WebhookServer::CertificatePem() const {
  std::lock_guard lock(impl_->mu);
  return impl_->cert_pem;
}

}  // namespace moeserve::op

#include "moeserve/daemon/http/http_server.hpp"

#include <array>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "connection_base.hpp"
#include "exchange_impl.hpp"
#include "moeserve/beast_setup/names.hpp"
#include "moeserve/beast_setup/server_setup.hpp"
#include "moeserve/common/log.hpp"
#include "response_bytes.hpp"
#include "tls_context.hpp"

namespace moeserve::daemon {

using namespace beast_setup::names;

namespace {

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// How many bytes of an unread body a refused request may send before the
// connection is closed: enough that the client reads the refusal before a
// reset, little enough that refusing costs nothing.
constexpr size_t kDrainBytes = 256 << 10;
constexpr double kDrainSeconds = 1.0;

}  // namespace

struct HttpServer::Impl {
  // Connections point at everything above `io`; io is declared after it so
  // that the connections it still holds are destroyed first.
  HttpServerOptions options;
  HttpServerHooks hooks;
  std::unique_ptr<ReloadingTlsContext> tls;
  std::vector<std::thread> threads;
  int port = 0;
  std::atomic<uint64_t> open{0}, refused{0}, timed_out{0}, oversized{0}, slow_cut{0};
  std::mutex conns_mu;
  std::unordered_map<ConnectionBase*, std::weak_ptr<ConnectionBase>> conns;
  asio::io_context io;
  tcp::acceptor acceptor{io};

  void Accept();
  HttpResponse Error(int status, const std::string& message) const {
    if (hooks.error_response) return hooks.error_response(status, message);
    return HttpResponse{status, "text/plain; charset=utf-8", {}, message + "\n"};
  }
  void Register(const std::shared_ptr<ConnectionBase>& c) {
    std::lock_guard lock(conns_mu);
    conns.emplace(c.get(), c);
  }
  void Unregister(ConnectionBase* c) {
    std::lock_guard lock(conns_mu);
    conns.erase(c);
  }
};

namespace {

// One client connection: reads a request head, asks `admit`, reads the body
// within its limit, hands the request to `handle`, writes what the exchange
// sends, then waits for the next request (keep-alive) or closes. All of it
// runs on the connection's strand.
template <class Stream>
class Connection : public ConnectionBase, public std::enable_shared_from_this<Connection<Stream>> {
 public:
  template <class... StreamArgs>
  Connection(HttpServer::Impl& server, std::shared_ptr<ssl::context> tls, StreamArgs&&... args)
      : server_(server),
        tls_(std::move(tls)),
        stream_(std::forward<StreamArgs>(args)...),
        timer_(stream_.get_executor()),
        buffer_(server.options.max_header_bytes + (64 << 10)) {}

  ~Connection() override { server_.open.fetch_sub(1); }

  void Run() {
    boost::system::error_code ec;
    Lowest().set_option(tcp::no_delay(true), ec);
    if constexpr (std::is_same_v<Stream, ssl::stream<tcp::socket>>) {
      Arm(server_.options.header_timeout_seconds);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](boost::system::error_code ec) {
        if (ec) return self->Close();
        self->ReadHead();
      });
    } else {
      ReadHead();
    }
  }

  // --- ConnectionBase: called by the exchange from any thread ---
  void PostReply(HttpResponse r) override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this(), r = std::move(r)]() mutable {
      self->SendWhole(std::move(r));
    });
  }
  void PostBeginStream(int status, std::string content_type, HttpHeaders headers) override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this(), status, ct = std::move(content_type),
                                        h = std::move(headers)]() mutable {
      if (self->closed_) return;
      self->Queue(StreamHeadBytes(status, ct, h, self->close_after_), 0);
    });
  }
  void PostChunk(std::string data, size_t accounted) override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this(), d = std::move(data), accounted]() mutable {
      if (self->closed_) return;
      self->Queue(ChunkBytes(d), accounted);
    });
  }
  void PostEndStream() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] {
      if (self->closed_) return;
      self->response_done_ = true;
      self->Queue(std::string(kLastChunk), 0);
    });
  }
  void PostClose() override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this()] { self->Close(); });
  }

 private:
  tcp::socket& Lowest() { return beast::get_lowest_layer(stream_); }

  void Arm(double seconds) {
    timer_.expires_after(Seconds(seconds));
    timer_.async_wait([self = this->shared_from_this()](boost::system::error_code ec) {
      // Re-armed or cancelled; a wait that completed just as it was re-armed
      // sees a later expiry.
      if (ec || self->closed_ || self->timer_.expiry() > std::chrono::steady_clock::now()) return;
      if (!self->draining_) self->server_.timed_out.fetch_add(1);
      self->Close();
    });
  }
  void Disarm() { timer_.cancel(); }

  // 1. The head, within the header size and time limits.
  void ReadHead() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    // Decided by admit, after the head. (Not boost::none: Beast 1.74 compares
    // the length against the optional and an empty one counts as less.)
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    Arm(server_.options.header_timeout_seconds);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = this->shared_from_this()](boost::system::error_code ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(boost::system::error_code ec) {
    if (closed_) return;
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
      return Refuse(server_.Error(431, "The request head is larger than " +
                                           std::to_string(server_.options.max_header_bytes) + " bytes"),
                    /*body_follows=*/true);
    }
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset || ec == ssl::error::stream_truncated) {
      return Close();
    }
    if (ec) return Refuse(server_.Error(400, "Malformed HTTP request: " + ec.message()), /*body_follows=*/true);

    const auto& msg = parser_->get();
    head_ = HttpHead{};
    head_.method = std::string(msg.method_string());
    std::string_view target(msg.target().data(), msg.target().size());
    auto q = target.find('?');
    head_.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) head_.query = std::string(target.substr(q + 1));
    for (const auto& field : msg) {
      head_.headers.emplace_back(Lower(std::string_view(field.name_string().data(), field.name_string().size())),
                                 std::string(field.value()));
    }
    if (auto n = parser_->content_length()) head_.content_length = *n;
    head_.chunked = parser_->chunked();
    close_after_ = !msg.keep_alive();
    in_request_ = true;
    response_done_ = false;

    HttpAdmission admission;
    try {
      admission = server_.hooks.admit(head_);
    } catch (const std::exception& e) {
      log::Error(std::string("http: admit threw: ") + e.what());
      admission = HttpAdmission::Refuse(server_.Error(500, "internal error while admitting the request"));
    }
    if (admission.refusal) return Refuse(std::move(*admission.refusal), head_.has_body());
    if (head_.content_length && *head_.content_length > admission.body_limit) {
      server_.oversized.fetch_add(1);
      return Refuse(server_.Error(413, BodyTooLargeMessage(admission.body_limit)), true);
    }
    if (!head_.has_body()) return Dispatch(std::string());
    body_limit_ = admission.body_limit;
    parser_->body_limit(admission.body_limit);
    if (Lower(head_.Header("expect")) == "100-continue") {
      // curl and others wait for this before sending a large body.
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      Arm(server_.options.write_timeout_seconds);
      asio::async_write(stream_, asio::buffer(*interim),
                        [self = this->shared_from_this(), interim](boost::system::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  static std::string BodyTooLargeMessage(size_t limit) {
    return "The request body is larger than this server's limit of " + std::to_string(limit) + " bytes";
  }

  // 2. The body, within the limit admit gave and the body time limit.
  void ReadBody() {
    if (closed_) return;
    Arm(server_.options.body_timeout_seconds);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](boost::system::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(boost::system::error_code ec) {
    if (closed_) return;
    if (ec == bhttp::error::body_limit) {
      server_.oversized.fetch_add(1);
      return Refuse(server_.Error(413, BodyTooLargeMessage(body_limit_)), true);
    }
    if (ec == asio::error::eof || ec == bhttp::error::partial_message || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == ssl::error::stream_truncated) {
      return Close();
    }
    if (ec) return Refuse(server_.Error(400, "Malformed HTTP request body: " + ec.message()), true);
    Dispatch(std::move(parser_->get().body()));
  }

  // 3. The handler; meanwhile a read stays pending so a hang-up is seen at once.
  void Dispatch(std::string body) {
    Disarm();
    parser_.reset();
    exchange_ = std::make_shared<ExchangeImpl>(this->shared_from_this(), server_.options.max_stream_buffer_bytes,
                                               &server_.slow_cut);
    Watch();
    try {
      server_.hooks.handle(head_, std::move(body), exchange_);
    } catch (const std::exception& e) {
      log::Error(std::string("http: ") + head_.method + " " + head_.path + ": handler threw: " + e.what());
      exchange_->Reply(server_.Error(500, std::string("internal error: ") + e.what()));
    }
  }

  void Watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(asio::buffer(watch_buf_),
                            [self = this->shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->OnWatch(ec, n);
                            });
  }

  void OnWatch(boost::system::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    if (ec == asio::error::operation_aborted && resume_after_watch_) {
      resume_after_watch_ = false;
      return ReadHead();
    }
    if (ec) {
      // The peer closed or reset: a request still running is told.
      return Close();
    }
    if (draining_) {
      drained_ += n;
      if (drained_ > kDrainBytes) return Close();
      return Watch();
    }
    // Bytes of the next request (pipelining): keep them for the parser.
    if (buffer_.size() + n > server_.options.max_header_bytes) return Close();
    auto space = buffer_.prepare(n);
    std::memcpy(space.data(), watch_buf_.data(), n);
    buffer_.commit(n);
    if (in_request_) return Watch();
    ReadHead();
  }

  // A refusal decided by the server or admit: answer it, and close when a body
  // we will not read may follow.
  void Refuse(HttpResponse r, bool body_follows) {
    in_request_ = true;
    if (body_follows) close_after_ = true;
    parser_.reset();
    SendWhole(std::move(r));
  }

  // 4. Writing: whole responses and stream pieces go through one queue.
  void SendWhole(HttpResponse r) {
    if (closed_) return;
    response_done_ = true;
    Queue(WholeResponseBytes(r, close_after_), 0);
  }

  void Queue(std::string bytes, size_t accounted) {
    out_.push_back({std::move(bytes), accounted});
    WriteNext();
  }

  void WriteNext() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (response_done_) return FinishResponse();
      return Disarm();  // waiting on the model: no deadline
    }
    writing_ = true;
    Arm(server_.options.write_timeout_seconds);
    asio::async_write(stream_, asio::buffer(out_.front().bytes),
                      [self = this->shared_from_this()](boost::system::error_code ec, size_t) {
                        self->writing_ = false;
                        if (ec || self->closed_) return self->Close();
                        if (self->exchange_) self->exchange_->Sent(self->out_.front().accounted);
                        self->out_.pop_front();
                        self->WriteNext();
                      });
  }

  void FinishResponse() {
    in_request_ = false;
    if (exchange_) exchange_->MarkComplete();
    exchange_.reset();
    if (close_after_) return StartDrainAndClose();
    if (watching_) {
      if (buffer_.size() > 0) {
        // The next request is already here (pipelined): stop the pending
        // read (its completion starts the parse) instead of waiting on it.
        resume_after_watch_ = true;
        boost::system::error_code ec;
        Lowest().cancel(ec);
        return;
      }
      // The pending read starts the next request when its bytes come.
      Arm(server_.options.header_timeout_seconds);
      return;
    }
    ReadHead();
  }

  // Half-close, then read and drop what the client still sends for a moment,
  // so that it reads our answer instead of a reset.
  void StartDrainAndClose() {
    draining_ = true;
    boost::system::error_code ec;
    Lowest().shutdown(tcp::socket::shutdown_send, ec);
    Arm(kDrainSeconds);
    if (!watching_) DrainRead();  // else OnWatch drains
  }

  void DrainRead() {
    watching_ = true;
    Lowest().async_read_some(asio::buffer(watch_buf_),
                             [self = this->shared_from_this()](boost::system::error_code ec, size_t n) {
                               self->watching_ = false;
                               if (ec || self->closed_) return self->Close();
                               self->drained_ += n;
                               if (self->drained_ > kDrainBytes) return self->Close();
                               self->DrainRead();
                             });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    timer_.cancel();
    boost::system::error_code ec;
    Lowest().shutdown(tcp::socket::shutdown_both, ec);
    Lowest().close(ec);
    // out_ stays: a write in flight still points into its front; the
    // connection (and the queue) go when the last handler lets go.
    if (exchange_) exchange_->MarkGone();  // a request still running stops
    exchange_.reset();
    server_.Unregister(this);
  }

  struct Pending {
    std::string bytes;
    size_t accounted;  // bytes the exchange counts as unsent (stream data)
  };

  HttpServer::Impl& server_;
  std::shared_ptr<ssl::context> tls_;  // kept alive as long as the stream uses it
  Stream stream_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  HttpHead head_;
  size_t body_limit_ = 0;
  std::shared_ptr<ExchangeImpl> exchange_;
  std::deque<Pending> out_;
  std::array<char, 1024> watch_buf_{};  // per connection: kept small (10,000 idle connections)
  bool writing_ = false, watching_ = false, in_request_ = false, response_done_ = false;
  bool close_after_ = false, closed_ = false, draining_ = false, resume_after_watch_ = false;
  size_t drained_ = 0;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(io), [this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      if (open.load() >= options.max_connections) {
        refused.fetch_add(1);
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        open.fetch_add(1);
        std::shared_ptr<ConnectionBase> conn;
        if (tls) {
          auto ctx = tls->Current();
          auto c = std::make_shared<Connection<ssl::stream<tcp::socket>>>(*this, ctx, std::move(socket), *ctx);
          conn = c;
          Register(conn);
          c->Run();
        } else {
          auto c = std::make_shared<Connection<tcp::socket>>(*this, nullptr, std::move(socket));
          conn = c;
          Register(conn);
          c->Run();
        }
      }
    } else if (ec == asio::error::no_descriptors) {
      // Out of file descriptors: back off briefly instead of spinning.
      log::Warn("http: accept: " + ec.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options, HttpServerHooks hooks) {
  if (!hooks.admit || !hooks.handle) return Fail(Error::InvalidArgument("http server: admit and handle are required"));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->hooks = std::move(hooks);
  const auto& o = impl->options;
  if (!o.tls_cert_file.empty() || !o.tls_key_file.empty()) {
    if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
      return Fail(Error::InvalidArgument("TLS needs both a certificate file and a key file"));
    }
    MOE_ASSIGN_OR_RETURN(impl->tls, ReloadingTlsContext::Create(
                                        o.tls_cert_file, o.tls_key_file,
                                        std::chrono::milliseconds(static_cast<int64_t>(o.tls_reload_check_seconds * 1000))));
  }
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  auto endpoints = resolver.resolve(o.host, std::to_string(o.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return Fail(Error::InvalidArgument("cannot resolve listen address '" + o.host + "': " + ec.message()));
  }
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto& a = impl->acceptor;
  ec = beast_setup::Listen(a, endpoint, asio::socket_base::max_listen_connections);
  if (ec) {
    return Fail(Error::Unavailable("cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message()));
  }
  impl->port = a.local_endpoint().port();
  impl->Accept();
  const int threads = std::max(1, o.threads);
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([io = &impl->io] {
      for (;;) {
        try {
          io->run();
          return;
        } catch (const std::exception& e) {
          // A handler bug costs its connection, never the server.
          log::Error(std::string("http: handler threw: ") + e.what());
        }
      }
    });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  Impl& m = *impl_;
  if (m.threads.empty()) return;
  std::vector<std::shared_ptr<ConnectionBase>> live;
  {
    std::lock_guard lock(m.conns_mu);
    for (auto& [raw, weak] : m.conns) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  asio::post(m.io, [&m] {
    boost::system::error_code ec;
    m.acceptor.close(ec);
  });
  for (auto& c : live) c->PostClose();
  live.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (m.open.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  m.io.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
}

int HttpServer::port() const { return impl_->port; }
bool HttpServer::tls() const { return impl_->tls != nullptr; }

HttpServerStats HttpServer::stats() const {
  HttpServerStats s;
  s.open_connections = impl_->open.load();
  s.refused_connections = impl_->refused.load();
  s.timed_out_connections = impl_->timed_out.load();
  s.oversized_bodies = impl_->oversized.load();
  s.slow_readers_cut = impl_->slow_cut.load();
  s.tls_reloads = impl_->tls ? impl_->tls->reloads() : 0;
  return s;
}

}  // namespace moeserve::daemon

// A small HTTP/1.1 server for test doubles: one thread per connection,
// keep-alive, Content-Length and chunked request bodies, and responses that
// are either whole or streamed as chunks (for Kubernetes watches).
//
// It exists because test doubles need control a framework hides: dropping a
// streamed response mid-way, or closing a connection abruptly, on purpose.
//
// Thread safety: Start/Stop from one thread; the handler is called from many
// connection threads at once and must be thread-safe itself.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moeserve::fakes {

struct HttpRequest {
  std::string method;
  std::string target;  // path?query as sent
  std::string path;    // percent-decoded path
  std::map<std::string, std::string> query;    // decoded; last value wins
  std::map<std::string, std::string> headers;  // keys lower-cased
  std::string body;
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
  std::string Query(const std::string& name) const {
    auto it = query.find(name);
    return it == query.end() ? std::string() : it->second;
  }
};

// What a handler writes. Either Send() once, or BeginStream() then
// WriteChunk()* then EndStream() (or Abort() to drop the connection).
class HttpResponseWriter {
 public:
  explicit HttpResponseWriter(int fd) : fd_(fd) {}
  void Send(int status, const std::string& content_type, const std::string& body);
  bool BeginStream(int status, const std::string& content_type);
  bool WriteChunk(const std::string& data);  // false when the peer went away
  void EndStream();
  void Abort();  // closes the connection without finishing the response
  bool sent() const { return sent_; }
  bool aborted() const { return aborted_; }

 private:
  bool WriteAll(const std::string& data);
  int fd_;
  bool sent_ = false;
  bool aborted_ = false;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponseWriter&)>;

class HttpServer {
 public:
  explicit HttpServer(HttpHandler handler);
  ~HttpServer();
  // Binds 127.0.0.1:port (0 picks an ephemeral port); returns the port or -1.
  int Start(int port = 0);
  void Stop();
  int port() const { return port_; }

 private:
  void AcceptLoop();
  void ServeConnection(int fd);

  HttpHandler handler_;
  int listen_fd_ = -1;
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<int> open_fds_;
  std::vector<std::thread> connection_threads_;
};

std::string PercentDecode(const std::string& s, bool plus_is_space);

}  // namespace moeserve::fakes

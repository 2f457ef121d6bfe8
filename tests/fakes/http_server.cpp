#include "http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace moeserve::fakes {
namespace {

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Reads from fd into buf until pred(buf) or EOF/error. Returns false on EOF.
bool ReadMore(int fd, std::string& buf) {
  char tmp[16384];
  ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
  if (n <= 0) return false;
  buf.append(tmp, static_cast<size_t>(n));
  return true;
}

}  // namespace

std::string PercentDecode(const std::string& s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && isxdigit(s[i + 1]) &&
        isxdigit(s[i + 2])) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool HttpResponseWriter::WriteAll(const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

void HttpResponseWriter::Send(int status, const std::string& content_type, const std::string& body) {
  std::ostringstream head;
  head << "HTTP/1.1 " << status << ' ' << ReasonPhrase(status) << "\r\n"
       << "Content-Type: " << content_type << "\r\n"
       << "Content-Length: " << body.size() << "\r\n"
       << "Cache-Control: no-cache, private\r\n\r\n";
  sent_ = true;
  WriteAll(head.str() + body);
}

bool HttpResponseWriter::BeginStream(int status, const std::string& content_type) {
  std::ostringstream head;
  head << "HTTP/1.1 " << status << ' ' << ReasonPhrase(status) << "\r\n"
       << "Content-Type: " << content_type << "\r\n"
       << "Transfer-Encoding: chunked\r\n"
       << "Cache-Control: no-cache, private\r\n\r\n";
  sent_ = true;
  return WriteAll(head.str());
}

bool HttpResponseWriter::WriteChunk(const std::string& data) {
  if (data.empty()) return true;
  char size[32];
  snprintf(size, sizeof size, "%zx\r\n", data.size());
  return WriteAll(std::string(size) + data + "\r\n");
}

void HttpResponseWriter::EndStream() { WriteAll("0\r\n\r\n"); }

void HttpResponseWriter::Abort() {
  aborted_ = true;
  sent_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

HttpServer::HttpServer(HttpHandler handler) : handler_(std::move(handler)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::Start(int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) return -1;
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  if (::listen(listen_fd_, 512) != 0) return -1;
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return port_;
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(connection_threads_);
  }
  for (auto& t : threads) t.join();
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, 100);
    if (r <= 0) continue;
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      break;
    }
    open_fds_.push_back(fd);
    connection_threads_.emplace_back([this, fd] { ServeConnection(fd); });
  }
}

void HttpServer::ServeConnection(int fd) {
  std::string buf;
  while (!stopping_) {
    size_t header_end;
    while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!ReadMore(fd, buf)) goto done;
    }
    {
      HttpRequest req;
      std::istringstream head(buf.substr(0, header_end));
      buf.erase(0, header_end + 4);
      std::string line;
      std::getline(head, line);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::istringstream request_line(line);
      std::string version;
      request_line >> req.method >> req.target >> version;
      while (std::getline(head, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        req.headers[Lower(line.substr(0, colon))] = value;
      }
      // Body: Content-Length or chunked.
      if (Lower(req.Header("transfer-encoding")) == "chunked") {
        while (true) {
          size_t eol;
          while ((eol = buf.find("\r\n")) == std::string::npos)
            if (!ReadMore(fd, buf)) goto done;
          size_t n = std::stoul(buf.substr(0, eol), nullptr, 16);
          buf.erase(0, eol + 2);
          while (buf.size() < n + 2)
            if (!ReadMore(fd, buf)) goto done;
          req.body.append(buf, 0, n);
          buf.erase(0, n + 2);
          if (n == 0) break;
        }
      } else if (!req.Header("content-length").empty()) {
        size_t n = std::stoul(req.Header("content-length"));
        while (buf.size() < n)
          if (!ReadMore(fd, buf)) goto done;
        req.body = buf.substr(0, n);
        buf.erase(0, n);
      }
      auto q = req.target.find('?');
      req.path = PercentDecode(req.target.substr(0, q), false);
      if (q != std::string::npos) {
        std::istringstream qs(req.target.substr(q + 1));
        std::string kv;
        while (std::getline(qs, kv, '&')) {
          auto eq = kv.find('=');
          if (eq == std::string::npos)
            req.query[PercentDecode(kv, true)] = "";
          else
            req.query[PercentDecode(kv.substr(0, eq), true)] = PercentDecode(kv.substr(eq + 1), true);
        }
      }
      HttpResponseWriter writer(fd);
      handler_(req, writer);
      if (!writer.sent()) writer.Send(500, "text/plain", "handler sent nothing");
      if (writer.aborted()) break;
      if (Lower(req.Header("connection")) == "close") break;
    }
  }
done:
  {
    std::lock_guard lock(mu_);
    open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  }
  ::close(fd);
}

}  // namespace moeserve::fakes

#include "admission.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>

#include "moeserve/common/base64.hpp"

namespace moeserve::fakes {

using nlohmann::json;

namespace {

bool Contains(const json& list, const std::string& value) {
  if (!list.is_array()) return false;
  for (const auto& v : list)
    if (v.is_string() && (v.get<std::string>() == "*" || v.get<std::string>() == value)) return true;
  return false;
}

std::string NewUid() {
  static std::mt19937_64 rng(std::random_device{}());
  static std::mutex mu;
  std::lock_guard lock(mu);
  char buf[40];
  snprintf(buf, sizeof buf, "%08llx-0000-4000-8000-%012llx", static_cast<unsigned long long>(rng() & 0xffffffffULL),
           static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return buf;
}

std::string SslError() {
  const unsigned long e = ERR_get_error();
  char buf[256] = {0};
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return e ? buf : "connection closed";
}

// Connects to 127.0.0.1:port within `timeout`; -1 and `error` when it cannot.
int Connect(int port, std::chrono::milliseconds timeout, std::string& error) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    error = "socket failed";
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 ? 0 : -1;
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (rc == 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (rc != 0 || so_error != 0) {
      error = rc != 0 ? "dial tcp 127.0.0.1:" + std::to_string(port) + ": i/o timeout"
                      : "dial tcp 127.0.0.1:" + std::to_string(port) + ": connect: connection refused";
      ::close(fd);
      return -1;
    }
  } else if (rc != 0) {
    error = "dial tcp 127.0.0.1:" + std::to_string(port) + ": connect: connection refused";
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, flags);
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

// OpenSSL writes to the socket with write(), which raises SIGPIPE when the
// webhook has gone away (a replica killed mid-call), and SIGPIPE ends the
// process. While one exists, SIGPIPE is blocked on this thread, and one it
// raised is taken off the thread's pending set before unblocking.
class BlockSigpipe {
 public:
  BlockSigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~BlockSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      sigtimedwait(&pipe, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

struct HttpsResult {
  bool ok = false;
  int status = 0;
  std::string body, error;
};

// One POST over TLS on a connected socket, verifying `host` against `ca_pem`.
HttpsResult Post(int fd, const std::string& host, const std::string& ca_pem, const std::string& path,
                 const std::string& body, std::chrono::steady_clock::time_point deadline) {
  HttpsResult out;
  BlockSigpipe no_sigpipe;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())),
                                                BIO_free);
  int loaded = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);
    X509_free(cert);
    loaded++;
  }
  ERR_clear_error();
  if (loaded == 0) SSL_CTX_set_default_verify_paths(ctx.get());
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  SSL_set_tlsext_host_name(ssl.get(), host.c_str());
  SSL_set1_host(ssl.get(), host.c_str());
  if (SSL_connect(ssl.get()) != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    out.error = verify != X509_V_OK ? std::string("tls: failed to verify certificate: ") +
                                          X509_verify_cert_error_string(verify)
                                    : "tls handshake: " + SslError();
    return out;
  }
  std::string request = "POST " + path + " HTTP/1.1\r\nHost: " + host +
                        "\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    const int n = SSL_write(ssl.get(), request.data() + sent, static_cast<int>(request.size() - sent));
    if (n <= 0) {
      out.error = "write: " + SslError();
      return out;
    }
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  while (true) {
    if (std::chrono::steady_clock::now() > deadline) {
      out.error = "context deadline exceeded";
      return out;
    }
    const int n = SSL_read(ssl.get(), buf, sizeof buf);
    if (n <= 0) {
      const int err = SSL_get_error(ssl.get(), n);
      if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0)) break;
      out.error = errno == EAGAIN || errno == EWOULDBLOCK ? "context deadline exceeded" : "read: " + SslError();
      return out;
    }
    response.append(buf, static_cast<size_t>(n));
    const size_t head_end = response.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      std::string head = response.substr(0, head_end);
      std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
      const size_t cl = head.find("content-length:");
      if (cl != std::string::npos && response.size() >= head_end + 4 + std::stoul(head.substr(cl + 15))) break;
    }
  }
  const size_t head_end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    out.error = "malformed HTTP response";
    return out;
  }
  out.status = std::atoi(response.c_str() + 9);
  out.body = response.substr(head_end + 4);
  out.ok = true;
  SSL_shutdown(ssl.get());
  return out;
}

}  // namespace

bool WebhookResourceMatches(const std::string& pattern, const std::string& resource, const std::string& subresource) {
  const auto slash = pattern.find('/');
  const std::string res = pattern.substr(0, slash);
  const std::string sub = slash == std::string::npos ? "" : pattern.substr(slash + 1);
  if (res != "*" && res != resource) return false;
  if (slash == std::string::npos) return subresource.empty();
  return sub == "*" || sub == subresource;
}

void WebhookAdmission::MapService(const std::string& ns, const std::string& name, std::vector<int> ports) {
  std::lock_guard lock(mu_);
  if (ports.empty())
    services_.erase(ns + "/" + name);
  else
    services_[ns + "/" + name] = std::move(ports);
}

std::vector<WebhookCall> WebhookAdmission::Calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

bool WebhookAdmission::ResolveTarget(const json& cc, Target& t, std::string& error) {
  if (!cc.is_object()) {
    error = "clientConfig is missing";
    return false;
  }
  if (cc.contains("url") && cc["url"].is_string()) {
    const std::string url = cc["url"].get<std::string>();
    if (url.rfind("https://", 0) != 0) {
      error = "clientConfig.url must be https";
      return false;
    }
    const std::string rest = url.substr(8);
    const size_t slash = rest.find('/');
    const std::string hostport = rest.substr(0, slash);
    t.path = slash == std::string::npos ? "/" : rest.substr(slash);
    const size_t colon = hostport.rfind(':');
    t.host = hostport.substr(0, colon);
    try {
      t.ports = {colon == std::string::npos ? 443 : std::stoi(hostport.substr(colon + 1))};
    } catch (...) {
      error = "clientConfig.url has a bad port";
      return false;
    }
    return true;
  }
  if (!cc.contains("service") || !cc["service"].is_object()) {
    error = "clientConfig has neither url nor service";
    return false;
  }
  const json& svc = cc["service"];
  const std::string ns = svc.value("namespace", ""), name = svc.value("name", "");
  t.host = name + "." + ns + ".svc";
  t.path = svc.value("path", "/");
  std::lock_guard lock(mu_);
  auto it = services_.find(ns + "/" + name);
  if (it == services_.end()) {
    error = "service \"" + name + "\" not found";
    return false;
  }
  // Rotate the start, as kube-proxy spreads connections over endpoints.
  const size_t start = rotation_++ % it->second.size();
  for (size_t i = 0; i < it->second.size(); ++i) t.ports.push_back(it->second[(start + i) % it->second.size()]);
  return true;
}

AdmissionVerdict WebhookAdmission::Admit(const std::vector<json>& configurations, const AdmissionAttributes& a) {
  std::vector<json> sorted = configurations;
  std::sort(sorted.begin(), sorted.end(), [](const json& x, const json& y) {
    return x["metadata"].value("name", "") < y["metadata"].value("name", "");
  });
  for (const auto& config : sorted) {
    for (const auto& hook : config.value("webhooks", json::array())) {
      if (!hook.is_object()) continue;
      bool matches = false;
      for (const auto& rule : hook.value("rules", json::array())) {
        if (!rule.is_object() || !Contains(rule.value("operations", json()), a.operation) ||
            !Contains(rule.value("apiGroups", json()), a.group) || !Contains(rule.value("apiVersions", json()), a.version))
          continue;
        for (const auto& pattern : rule.value("resources", json::array()))
          if (pattern.is_string() && WebhookResourceMatches(pattern.get<std::string>(), a.resource, a.subresource))
            matches = true;
      }
      if (!matches) continue;
      const std::string name = hook.value("name", "");
      const bool ignore = hook.value("failurePolicy", "Fail") == "Ignore";
      const int timeout_s = std::clamp(hook.value("timeoutSeconds", 10), 1, 30);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
      const std::string uid = NewUid();
      json request = {{"uid", uid},
                      {"kind", {{"group", a.kind_group}, {"version", a.kind_version}, {"kind", a.kind}}},
                      {"resource", {{"group", a.group}, {"version", a.version}, {"resource", a.resource}}},
                      {"requestKind", {{"group", a.kind_group}, {"version", a.kind_version}, {"kind", a.kind}}},
                      {"requestResource", {{"group", a.group}, {"version", a.version}, {"resource", a.resource}}},
                      {"name", a.name},
                      {"operation", a.operation},
                      {"userInfo", {{"username", a.username}, {"groups", json::array({"system:authenticated"})}}},
                      {"object", a.object},
                      {"oldObject", a.old_object},
                      {"dryRun", a.dry_run},
                      {"options", nullptr}};
      if (!a.subresource.empty()) {
        request["subResource"] = a.subresource;
        request["requestSubResource"] = a.subresource;
      }
      if (!a.ns.empty()) request["namespace"] = a.ns;
      const std::string body =
          json({{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", request}}).dump();

      // Call it: the first endpoint that takes the connection answers.
      std::string error;
      HttpsResult result;
      Target target;
      const json cc = hook.value("clientConfig", json::object());
      if (ResolveTarget(cc, target, error)) {
        const std::string ca = cc.is_object() && cc.value("caBundle", json()).is_string()
                                   ? Base64Decode(cc["caBundle"].get<std::string>())
                                   : "";
        const std::string path = target.path + (target.path.find('?') == std::string::npos ? "?" : "&") +
                                 "timeout=" + std::to_string(timeout_s) + "s";
        for (int port : target.ports) {
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          const int fd = Connect(port, std::max(left, std::chrono::milliseconds(1)), error);
          if (fd < 0) continue;
          result = Post(fd, target.host, ca, path, body, deadline);
          ::close(fd);
          if (!result.ok) error = result.error;
          break;
        }
        if (!result.ok)
          error = "failed to call webhook: Post \"https://" + target.host + ":" +
                std::to_string(cc.contains("service") ? cc["service"].value("port", 443) : target.ports.front()) +
                path + "\": " + (error.empty() ? "no endpoint" : error);
      }
      json review;
      if (result.ok) {
        if (result.status != 200) {
          error = "failed to call webhook: the server responded with status " + std::to_string(result.status) +
                  ": " + result.body.substr(0, 512);
        } else {
          review = json::parse(result.body, nullptr, false);
          const json response = review.is_object() ? review.value("response", json()) : json();
          if (!response.is_object() || !response.value("allowed", json()).is_boolean())
            error = "received invalid webhook response: expected response.allowed to be set";
          else if (response.value("uid", "") != uid)
            error = "expected response.uid=\"" + uid + "\", got \"" + response.value("uid", "") + "\"";
          else
            error.clear();
        }
      }
      WebhookCall call{name, a.operation, a.resource, a.subresource, false, !error.empty(), error};
      if (!error.empty()) {
        {
          std::lock_guard lock(mu_);
          calls_.push_back(call);
        }
        if (ignore) continue;
        return {false, 500, "InternalError",
                "Internal error occurred: failed calling webhook \"" + name + "\": " + error};
      }
      const json& response = review["response"];
      call.allowed = response["allowed"].get<bool>();
      {
        std::lock_guard lock(mu_);
        calls_.push_back(call);
      }
      if (call.allowed) continue;
      const json status = response.value("status", json::object());
      const int code = status.is_object() && status.value("code", json()).is_number_integer() && status.value("code", 0) >= 400
                           ? status.value("code", 403)
                           : 403;
      const std::string message = status.is_object() && status.value("message", json()).is_string()
                                      ? status.value("message", "")
                                      : "";
      return {false, code, code == 403 ? "Forbidden" : status.value("reason", "BadRequest"),
              "admission webhook \"" + name + "\" denied the request" + (message.empty() ? "" : ": " + message)};
    }
  }
  return {};
}

}  // namespace moeserve::fakes

#include "moeserve/http_client/curl_easy.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <mutex>

#include "moeserve/http_client/url_parts.hpp"

namespace moeserve::http_client {

namespace {

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Collected {
  std::string* body;
  size_t cap;
  bool too_large = false;
};

size_t Collect(char* data, size_t size, size_t n, void* user) {
  auto* c = static_cast<Collected*>(user);
  if (c->body->size() + size * n > c->cap) {
    c->too_large = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  c->body->append(data, size * n);
  return size * n;
}

// Whether the transfer now connecting is to one of the guard's allowed
// hosts: the URL it is connecting for (after any redirect) is the one
// libcurl reports as effective at this point.
bool ToAllowedHost(CURL* curl, const AddressGuard& guard) {
  if (guard.allowed_hosts.empty()) return false;
  char* url = nullptr;
  if (curl_easy_getinfo(curl, CURLINFO_EFFECTIVE_URL, &url) != CURLE_OK || !url) return false;
  const auto parts = ParseUrl(url);
  return parts && std::find(guard.allowed_hosts.begin(), guard.allowed_hosts.end(), parts->host) !=
                      guard.allowed_hosts.end();
}

}  // namespace

// libcurl opens every socket of a guarded transfer through here: the last
// word on where it connects, made on the address it resolved.
curl_socket_t CurlEasy::OpenGuardedSocket(void* clientp, curlsocktype purpose, curl_sockaddr* address) {
  auto* state = static_cast<GuardState*>(clientp);
  const bool allowed = purpose == CURLSOCKTYPE_IPCXN &&
                       (IsPublicAddress(&address->addr) || ToAllowedHost(state->curl, state->guard));
  if (!allowed) {
    const std::string text = AddressText(&address->addr);
    state->refused.push_back(text.empty() ? "a socket of family " + std::to_string(address->family) : text);
    return CURL_SOCKET_BAD;
  }
  return ::socket(address->family, address->socktype, address->protocol);
}

CurlStringList::~CurlStringList() { curl_slist_free_all(list_); }

CurlStringList& CurlStringList::Add(const std::string& line) {
  if (curl_slist* grown = curl_slist_append(list_, line.c_str())) list_ = grown;
  return *this;
}

CurlEasy::CurlEasy() {
  GlobalInitOnce();
  curl_ = curl_easy_init();
}

CurlEasy::~CurlEasy() {
  if (curl_) curl_easy_cleanup(curl_);
}

void CurlEasy::Prepare(const CurlPolicy& p) {
  curl_easy_reset(curl_);
  errbuf_[0] = '\0';
  guard_ = GuardState{curl_, p.guard, {}};
  curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, errbuf_);
  if (p.timeout.count() > 0) curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(p.timeout.count()));
  if (p.connect_timeout.count() > 0)
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(p.connect_timeout.count()));
  if (p.low_speed_bytes > 0) {
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_LIMIT, p.low_speed_bytes);
    curl_easy_setopt(curl_, CURLOPT_LOW_SPEED_TIME, static_cast<long>(p.low_speed_time.count()));
  }
  if (!p.protocols.empty()) curl_easy_setopt(curl_, CURLOPT_PROTOCOLS_STR, p.protocols.c_str());
  curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, p.max_redirects > 0 ? 1L : 0L);
  if (p.max_redirects > 0) {
    curl_easy_setopt(curl_, CURLOPT_MAXREDIRS, p.max_redirects);
    if (!p.redirect_protocols.empty())
      curl_easy_setopt(curl_, CURLOPT_REDIR_PROTOCOLS_STR, p.redirect_protocols.c_str());
  }
  if (p.proxy == Proxy::kNever || p.guard.public_only) curl_easy_setopt(curl_, CURLOPT_PROXY, "");
  if (p.guard.public_only) {
    curl_easy_setopt(curl_, CURLOPT_OPENSOCKETFUNCTION, &CurlEasy::OpenGuardedSocket);
    curl_easy_setopt(curl_, CURLOPT_OPENSOCKETDATA, &guard_);
  }
  if (!p.ca_file.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, p.ca_file.c_str());
  if (!p.ca_pem.empty()) {
    curl_blob ca{const_cast<char*>(p.ca_pem.data()), p.ca_pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl_, CURLOPT_CAINFO_BLOB, &ca);
  }
  if (!p.ca_file.empty() || !p.ca_pem.empty()) curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYPEER, 1L);
  if (!p.verify_host) curl_easy_setopt(curl_, CURLOPT_SSL_VERIFYHOST, 0L);
  if (p.tcp_keepalive) curl_easy_setopt(curl_, CURLOPT_TCP_KEEPALIVE, 1L);
  if (!p.user_agent.empty()) curl_easy_setopt(curl_, CURLOPT_USERAGENT, p.user_agent.c_str());
}

CURLcode CurlEasy::Perform() {
  guard_.refused.clear();
  return curl_easy_perform(curl_);
}

long CurlEasy::ResponseCode() const {
  long code = 0;
  curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &code);
  return code;
}

CurlAnswer CurlFetch(const CurlCall& call, const CurlPolicy& policy) {
  CurlAnswer a;
  CurlEasy easy;
  if (!easy.ok()) {
    a.code = CURLE_FAILED_INIT;
    a.error = curl_easy_strerror(a.code);
    return a;
  }
  easy.Prepare(policy);
  CURL* c = easy.get();
  CurlStringList headers;
  for (const std::string& h : call.headers) headers.Add(h);
  curl_easy_setopt(c, CURLOPT_URL, call.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  if (call.method != "GET") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, call.method.c_str());
  if (call.body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, call.body->data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(call.body->size()));
  }
  Collected sink{&a.body, call.max_answer_bytes};
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  a.code = easy.Perform();
  a.status = easy.ResponseCode();
  a.too_large = sink.too_large;
  a.refused_addresses = easy.RefusedAddresses();
  if (a.code != CURLE_OK) {
    a.error = curl_easy_strerror(a.code);
    a.detail = easy.ErrorDetail();
  }
  return a;
}

}  // namespace moeserve::http_client

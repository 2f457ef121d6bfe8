#include "sessions/session_forward.hpp"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve::daemon {

namespace {

struct Transfer {
  std::shared_ptr<HttpExchange> exchange;
  CURL* curl = nullptr;
  std::string content_type;
  HttpHeaders headers;  // passed on: Retry-After, X-MoE-Downgraded
  std::string body;
  bool streaming = false;

  int Status() const {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    return static_cast<int>(code);
  }
};

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.starts_with("HTTP/")) {  // a new response (after 100 Continue):
                                    // forget the last one's headers
    t->headers.clear();
    t->content_type.clear();
    return size * n;
  }
  auto colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon);
  for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string value = Trim(line.substr(colon + 1));
  if (name == "content-type")
    t->content_type = value;
  else if (name == "retry-after")
    t->headers.emplace_back("Retry-After", value);
  else if (name == "x-moe-downgraded")
    t->headers.emplace_back("X-MoE-Downgraded", value);
  else if (name == "cache-control")
    t->headers.emplace_back("Cache-Control", value);
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (!t->streaming && t->content_type.starts_with("text/event-stream")) {
    t->streaming = true;
    HttpHeaders h = t->headers;
    h.emplace_back("X-Accel-Buffering", "no");
    t->exchange->BeginStream(t->Status(), t->content_type, std::move(h));
  }
  if (t->streaming) {
    if (t->exchange->Write(std::string(data, size * n)) != HttpExchange::WriteResult::kQueued) return 0;  // abort
  } else {
    t->body.append(data, size * n);
  }
  return size * n;
}

std::string SecondsText(long ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", ms / 1000.0);
  return buf;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<Transfer*>(user)->exchange->client_gone() ? 1 : 0;
}

}  // namespace

PeerForwarder::PeerForwarder(int max_in_flight, double deadline_seconds)
    : max_in_flight_(max_in_flight), deadline_seconds_(deadline_seconds), counter_(std::make_shared<std::atomic<int>>(0)) {}

void PeerForwarder::Forward(const std::string& base_url, const HttpHead& head, std::string body,
                            std::shared_ptr<HttpExchange> exchange, const char* forwarded_header) {
  if (counter_->fetch_add(1) >= max_in_flight_) {
    counter_->fetch_sub(1);
    return ReplyError(*exchange, ApiError::Unavailable("Too many requests are being forwarded to other replicas (" +
                                                           std::to_string(max_in_flight_) +
                                                           " at once, session_forward_max_in_flight); retry shortly",
                                                       1));
  }
  std::string url = base_url + head.path + (head.query.empty() ? "" : "?" + head.query);
  std::string auth = head.Header("authorization");
  std::string method = head.method;
  const long deadline_ms = static_cast<long>(deadline_seconds_ * 1000);
  std::thread([url, auth, method, body = std::move(body), exchange = std::move(exchange), forwarded_header,
               deadline_ms, counter = counter_]() mutable {
    struct Release {  // every way out of the thread gives its slot back
      std::atomic<int>& n;
      ~Release() { n.fetch_sub(1); }
    } release{*counter};
    Transfer t;
    t.exchange = exchange;
    http_client::CurlEasy curl;
    if (!curl.ok()) return ReplyError(*exchange, ApiError::Internal("forwarding: libcurl could not start"));
    t.curl = curl.get();
    http_client::CurlPolicy policy;
    policy.proxy = http_client::Proxy::kNever;  // peers are addressed directly
    policy.connect_timeout = std::chrono::milliseconds(std::min(5000L, deadline_ms));
    policy.timeout = std::chrono::milliseconds(deadline_ms);
    policy.max_redirects = 0;
    curl.Prepare(policy);
    http_client::CurlStringList headers;
    if (!auth.empty()) headers.Add("Authorization: " + auth);
    headers.Add("Content-Type: application/json");
    headers.Add("Expect:");
    headers.Add(std::string(forwarded_header) + ": 1");
    curl_easy_setopt(t.curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(t.curl, CURLOPT_HTTPHEADER, headers.get());
    if (method == "POST") {
      curl_easy_setopt(t.curl, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(t.curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    } else if (method != "GET") {
      curl_easy_setopt(t.curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    }
    curl_easy_setopt(t.curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(t.curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(t.curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(t.curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(t.curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(t.curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(t.curl, CURLOPT_XFERINFODATA, &t);
    CURLcode rc = curl.Perform();
    if (t.streaming) {
      exchange->EndStream();  // a peer that failed mid-stream leaves it without
                              // [DONE]: not acknowledged
    } else if (rc == CURLE_OK) {
      exchange->Reply(HttpResponse{t.Status(), t.content_type.empty() ? "application/json" : t.content_type, t.headers,
                                   std::move(t.body)});
    } else if (rc == CURLE_OPERATION_TIMEDOUT && !exchange->client_gone()) {
      log::Warn("sessions: forwarding to " + url.substr(0, url.find("/v1/")) + " passed its deadline of " +
                SecondsText(deadline_ms) + " s");
      ReplyError(*exchange, ApiError::Unavailable("The replica that owns this session did not answer within " +
                                                      SecondsText(deadline_ms) +
                                                      " s (session_forward_deadline_seconds); retry shortly",
                                                  2));
    } else if (!exchange->client_gone()) {
      log::Warn("sessions: forwarding to " + url.substr(0, url.find("/v1/")) + " failed: " + curl_easy_strerror(rc));
      ReplyError(*exchange, ApiError::Unavailable("The replica that owns this session is not reachable (" +
                                                      std::string(curl_easy_strerror(rc)) + "); retry shortly",
                                                  2));
    }
  }).detach();
}

}  // namespace moeserve::daemon

#include "session_forward.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/daemon/chat_service.hpp"

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
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
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
    t.curl = curl_easy_init();
    if (!t.curl) return ReplyError(*exchange, ApiError::Internal("forwarding: libcurl could not start"));
    curl_slist* headers = nullptr;
    if (!auth.empty()) headers = curl_slist_append(headers, ("Authorization: " + auth).c_str());
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    headers = curl_slist_append(headers, (std::string(forwarded_header) + ": 1").c_str());
    curl_easy_setopt(t.curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(t.curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(t.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t.curl, CURLOPT_NOPROXY,
                     "*");  // peers are addressed directly
    curl_easy_setopt(t.curl, CURLOPT_CONNECTTIMEOUT_MS, std::min(5000L, deadline_ms));
    curl_easy_setopt(t.curl, CURLOPT_TIMEOUT_MS, deadline_ms);
    curl_easy_setopt(t.curl, CURLOPT_FOLLOWLOCATION, 0L);
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
    CURLcode rc = curl_easy_perform(t.curl);
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
    curl_slist_free_all(headers);
    curl_easy_cleanup(t.curl);
  }).detach();
}

}  // namespace moeserve::daemon

// http(s):// and s3:// sources over libcurl. S3 is HTTP plus SigV4 headers,
// bucket/key addressing and S3's XML error bodies.
//
// Redirects (http(s) sources only; S3 answers its own with errors) never go
// from https to http: libcurl may follow an https source only to https
// (CURLOPT_REDIR_PROTOCOLS_STR), and every hop's Location is checked as its
// headers arrive, so the transfer stops, before any request goes out in
// clear text, with an error naming both ends.
#include <curl/curl.h>
#include <strings.h>

#include <cstring>

#include <algorithm>
#include <regex>

#include "moeserve/storage/s3_listing.hpp"
#include "moeserve/storage/sigv4.hpp"
#include "moeserve/http_client/curl_easy.hpp"
#include "source_factories.hpp"

namespace moeserve::storage {
namespace {

// What the server said, in one line: S3's <Code>: <Message>, else the body's start.
std::string ServerSaid(const std::string& body) {
  std::string code = XmlField(body, "Code"), message = XmlUnescape(XmlField(body, "Message"));
  if (!code.empty()) return code + (message.empty() ? "" : ": " + message);
  std::string s = body.substr(0, 200);
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s.empty() ? "(empty body)" : s;
}

struct Transfer {
  uint64_t offset = 0;
  uint64_t want = kToEnd;
  const ByteSink* sink = nullptr;
  CURL* curl = nullptr;
  long status = 0;
  bool status_known = false;
  uint64_t skip = 0;         // bytes to drop when a server ignored the Range header
  uint64_t delivered = 0;
  bool got_enough = false;   // we stopped the transfer on purpose
  Status sink_status = Ok();
  // Our own stall detector: curl's LOW_SPEED_TIME averages over ~5 s windows,
  // so after a fast burst it notices a dead stream several seconds late.
  std::chrono::steady_clock::time_point last_byte = std::chrono::steady_clock::now();
  curl_off_t last_now = 0;
  std::chrono::milliseconds stall_timeout{0};
  bool stalled = false;
  std::string error_body;
  std::optional<std::chrono::milliseconds> retry_after;
  bool following = false;    // curl follows redirects (http(s) sources)
  std::string downgrade_to;  // set when a hop from https pointed at http
  std::string downgrade_from;
};

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && strncasecmp(s.data(), prefix.data(), prefix.size()) == 0;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) t->retry_after.reset();
  if (t->following && StartsWithNoCase(line, "location:")) {
    std::string_view target = line.substr(9);
    while (!target.empty() && (target.front() == ' ' || target.front() == '\t')) target.remove_prefix(1);
    while (!target.empty() && (target.back() == '\r' || target.back() == '\n' || target.back() == ' '))
      target.remove_suffix(1);
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    char* current = nullptr;
    curl_easy_getinfo(t->curl, CURLINFO_EFFECTIVE_URL, &current);
    // A relative Location keeps the scheme; only an absolute http:// one downgrades.
    if (code >= 300 && code < 400 && current && StartsWithNoCase(current, "https://") &&
        StartsWithNoCase(target, "http://")) {
      t->downgrade_from = current;
      t->downgrade_to = std::string(target);
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR) before curl follows
    }
  }
  if (line.size() > 12 && strncasecmp(line.data(), "retry-after:", 12) == 0) {
    std::string v(line.substr(12));
    try {
      size_t used = 0;
      long seconds = std::stol(v, &used);
      if (seconds >= 0) t->retry_after = std::chrono::milliseconds(seconds * 1000);
    } catch (...) {
      // Retry-After may also be an HTTP-date.
      time_t when = curl_getdate(v.c_str(), nullptr);
      time_t now = time(nullptr);
      if (when > 0) t->retry_after = std::chrono::milliseconds(std::max<int64_t>(0, (when - now) * 1000));
    }
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t total = size * n;
  if (!t->status_known) {
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->status);
    t->status_known = true;
    if (t->status == 200 && t->offset > 0) t->skip = t->offset;
  }
  if (t->status < 200 || t->status >= 300) {
    if (t->error_body.size() < 16384) t->error_body.append(data, std::min<size_t>(total, 16384));
    return total;
  }
  size_t pos = 0;
  if (t->skip > 0) {
    size_t drop = static_cast<size_t>(std::min<uint64_t>(t->skip, total));
    t->skip -= drop;
    pos = drop;
  }
  size_t take = total - pos;
  if (t->want != kToEnd) take = static_cast<size_t>(std::min<uint64_t>(take, t->want - t->delivered));
  if (take > 0) {
    t->sink_status = (*t->sink)(data + pos, take);
    if (!t->sink_status) return 0;
    t->delivered += take;
  }
  if (t->want != kToEnd && t->delivered >= t->want && pos + take < total) {
    t->got_enough = true;  // a 200 with the whole object: we have our range
    return 0;
  }
  return total;
}

int OnProgress(void* user, curl_off_t, curl_off_t dlnow, curl_off_t, curl_off_t ulnow) {
  auto* t = static_cast<Transfer*>(user);
  auto now = std::chrono::steady_clock::now();
  if (dlnow + ulnow != t->last_now) {
    t->last_now = dlnow + ulnow;
    t->last_byte = now;
    return 0;
  }
  if (now - t->last_byte > t->stall_timeout) {
    t->stalled = true;
    return 1;  // aborts with CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

std::string EncodeKeyPath(const std::string& key) { return AwsUriEncode(key, false); }

class HttpConnection final : public ObjectConnection {
 public:
  HttpConnection(const std::string& base_url, const std::optional<S3Target>& s3, const SourceOptions& options)
      : base_url_(base_url), s3_(s3), options_(options) {}

  Result<uint64_t> Get(const std::string& key, uint64_t offset, uint64_t length, const ByteSink& sink) override {
    if (length == 0) return uint64_t{0};
    KeyValues extra;
    if (offset > 0 || length != kToEnd) {
      std::string range = "bytes=" + std::to_string(offset) + "-";
      if (length != kToEnd) range += std::to_string(offset + length - 1);
      extra.emplace_back("range", range);
    }
    HttpRequestSpec spec;
    if (s3_) {
      spec = BuildS3Request(s3_->endpoint, s3_->credentials, "GET", s3_->bucket, s3_->prefix + key, {}, extra,
                            std::chrono::system_clock::now());
    } else {
      spec = {"GET", base_url_ + EncodeKeyPath(key), extra};
    }
    Transfer t;
    t.offset = offset;
    t.want = length;
    t.sink = &sink;
    MOE_TRY(Perform(spec, t));
    retry_after_ = t.retry_after;
    if (t.status >= 200 && t.status < 300) {
      if (length != kToEnd && t.delivered < length)
        return Fail(Error::Unavailable(Describe(key) + ": short body: got " + std::to_string(t.delivered) + " of " +
                                       std::to_string(length) + " bytes"));
      return t.delivered;
    }
    return Fail(StatusError(key, t));
  }

  // Lists bucket/prefix with ListObjectsV2, following continuation tokens.
  Result<std::vector<ObjectInfo>> List() {
    std::vector<ObjectInfo> out;
    std::string token;
    for (;;) {
      KeyValues query = {{"list-type", "2"}, {"prefix", s3_->prefix}};
      if (!token.empty()) query.emplace_back("continuation-token", token);
      HttpRequestSpec spec = BuildS3Request(s3_->endpoint, s3_->credentials, "GET", s3_->bucket, "", query, {},
                                            std::chrono::system_clock::now());
      std::string body;
      ByteSink sink = [&](const char* d, size_t n) {
        body.append(d, n);
        return Ok();
      };
      Transfer t;
      t.sink = &sink;
      MOE_TRY(Perform(spec, t));
      if (t.status != 200) return Fail(StatusError("", t));
      MOE_ASSIGN_OR_RETURN(S3ListPage page, ParseS3ListPage(body, s3_->bucket, s3_->prefix));
      out.insert(out.end(), page.objects.begin(), page.objects.end());
      token = std::move(page.next_continuation_token);
      if (token.empty()) break;
    }
    return out;
  }

  std::optional<std::chrono::milliseconds> RetryAfter() const override { return retry_after_; }

  std::string Describe(const std::string& key) const {
    if (s3_) return "bucket '" + s3_->bucket + "', key '" + s3_->prefix + key + "'";
    return base_url_ + EncodeKeyPath(key);
  }

 private:
  Status Perform(const HttpRequestSpec& spec, Transfer& t) {
    if (!easy_.ok()) return Fail(Error::Internal(spec.method + " " + spec.url + ": libcurl could not start"));
    CURL* curl = easy_.get();
    t.curl = curl;
    t.following = !s3_;
    const bool https = spec.url.rfind("https://", 0) == 0;
    http_client::CurlPolicy policy;
    policy.max_redirects = t.following ? 10 : 0;
    policy.redirect_protocols = https ? "https" : "http,https";
    policy.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options_.connect_timeout);
    policy.proxy = http_client::Proxy::kFromEnvironment;
    policy.tcp_keepalive = true;
    policy.ca_file = options_.ca_file;
    easy_.Prepare(policy);
    http_client::CurlStringList headers;
    for (const auto& [k, v] : spec.headers) headers.Add(k + ": " + v);
    curl_easy_setopt(curl, CURLOPT_URL, spec.url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
    t.stall_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options_.stall_timeout);
    t.last_byte = std::chrono::steady_clock::now();
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    CURLcode rc = easy_.Perform();
    const std::string errbuf = easy_.ErrorDetail();
    if (!t.status_known) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t.status);
    if (!t.downgrade_to.empty())
      return Fail(Error::PermissionDenied(spec.method + " " + spec.url + ": " + t.downgrade_from + " redirected to " +
                                          t.downgrade_to + "; refusing to follow a redirect from https to http"));
    if (rc == CURLE_UNSUPPORTED_PROTOCOL && https) {
      char* last = nullptr;
      curl_easy_getinfo(curl, CURLINFO_EFFECTIVE_URL, &last);
      if (last && std::string_view(last) != spec.url)
        return Fail(Error::PermissionDenied(spec.method + " " + spec.url + ": redirected to " + last +
                                            "; an https source is followed only to https"));
    }
    MOE_TRY(t.sink_status);
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.got_enough)) return Ok();
    std::string what = spec.method + " " + spec.url + ": " + curl_easy_strerror(rc) +
                       (errbuf.empty() ? "" : " (" + errbuf + ")") + " after " +
                       std::to_string(t.delivered) + " body bytes";
    if (t.stalled)
      return Fail(Error::Timeout(spec.method + " " + spec.url + ": no byte for " +
                                 std::to_string(t.stall_timeout.count()) + " ms after " + std::to_string(t.delivered) +
                                 " body bytes (stalled)"));
    switch (rc) {
      case CURLE_OPERATION_TIMEDOUT:
        return Fail(Error::Timeout(what));
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
        return Fail(Error::InvalidArgument(what));
      default:
        return Fail(Error::Unavailable(what));  // resets, refused connections, partial bodies
    }
  }

  Error StatusError(const std::string& key, const Transfer& t) const {
    std::string where = s3_ ? (key.empty() ? "bucket '" + s3_->bucket + "', prefix '" + s3_->prefix + "'" : Describe(key))
                            : Describe(key);
    std::string msg = where + ": HTTP " + std::to_string(t.status) + ": " + ServerSaid(t.error_body);
    if (t.status == 404) return Error::NotFound(msg);
    if (t.status == 401 || t.status == 403) return Error::PermissionDenied(msg);
    if (t.status == 408 || t.status == 429 || t.status >= 500) return Error::Unavailable(msg);
    return Error::InvalidArgument(msg);
  }

  std::string base_url_;
  std::optional<S3Target> s3_;
  SourceOptions options_;
  http_client::CurlEasy easy_;  // one handle per connection: libcurl keeps the connection between requests
  std::optional<std::chrono::milliseconds> retry_after_;
};

class HttpSource final : public ObjectSource {
 public:
  HttpSource(std::string base_url, std::optional<S3Target> s3, SourceOptions options)
      : base_url_(std::move(base_url)), s3_(std::move(s3)), options_(std::move(options)) {}
  std::unique_ptr<ObjectConnection> Connect() override {
    return std::make_unique<HttpConnection>(base_url_, s3_, options_);
  }
  Result<std::vector<ObjectInfo>> List() override {
    if (!s3_)
      return Fail(Error::InvalidArgument("source '" + base_url_ +
                                         "': http(s) sources cannot be listed; a manifest.json is required"));
    HttpConnection conn(base_url_, s3_, options_);
    return conn.List();
  }
  std::string Describe(const std::string& key) const override {
    if (s3_) return "s3://" + s3_->bucket + "/" + s3_->prefix + key;
    return base_url_ + EncodeKeyPath(key);
  }

 private:
  std::string base_url_;
  std::optional<S3Target> s3_;
  SourceOptions options_;
};

}  // namespace

std::unique_ptr<ObjectSource> MakeHttpSource(const std::string& base_url, std::optional<S3Target> s3,
                                             const SourceOptions& options) {
  return std::make_unique<HttpSource>(base_url, std::move(s3), options);
}

}  // namespace moeserve::storage

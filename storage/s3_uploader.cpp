#include "s3_uploader.hpp"

#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/s3_listing.hpp"

namespace moeserve::storage {

struct S3Uploader::Response {
  long status = 0;
  KeyValues headers;  // names lowercased
  std::string body;
  std::string Header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return "";
  }
};

// What a request sends: nothing, bytes in memory, or a whole file streamed from disk.
struct S3Uploader::Body {
  std::string_view bytes;
  std::string file;  // when set, streamed instead of bytes
  uint64_t file_size = 0;
};

namespace {

std::string ServerSaid(const std::string& body) {
  std::string code = XmlField(body, "Code"), message = XmlUnescape(XmlField(body, "Message"));
  if (!code.empty()) return code + (message.empty() ? "" : ": " + message);
  std::string s = body.substr(0, 200);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s.empty() ? "(empty body)" : s;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  std::string line(data, size * n);
  auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon), value = line.substr(colon + 1);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    auto first = value.find_first_not_of(" \t"), last = value.find_last_not_of(" \t\r\n");
    value = first == std::string::npos ? "" : value.substr(first, last - first + 1);
    static_cast<KeyValues*>(user)->emplace_back(name, value);
  }
  return size * n;
}

struct MemoryReader {
  std::string_view data;
  size_t pos = 0;
};

size_t ReadMemory(char* out, size_t size, size_t n, void* user) {
  auto* r = static_cast<MemoryReader*>(user);
  size_t k = std::min(size * n, r->data.size() - r->pos);
  std::copy_n(r->data.data() + r->pos, k, out);
  r->pos += k;
  return k;
}

size_t ReadFile(char* out, size_t size, size_t n, void* user) {
  size_t k = std::fread(out, 1, size * n, static_cast<FILE*>(user));
  if (k == 0 && std::ferror(static_cast<FILE*>(user))) return CURL_READFUNC_ABORT;
  return k;
}

std::string Quote(const std::string& etag) { return etag.starts_with('"') ? etag : "\"" + etag + "\""; }

}  // namespace

S3Uploader::S3Uploader(S3Endpoint endpoint, AwsCredentials credentials, std::string bucket, std::string ca_file,
                       RetryPolicy retry)
    : endpoint_(std::move(endpoint)),
      credentials_(std::move(credentials)),
      bucket_(std::move(bucket)),
      ca_file_(std::move(ca_file)),
      retry_(retry) {}

S3Uploader::~S3Uploader() = default;

Result<S3Uploader::Response> S3Uploader::Send(const std::string& method, const std::string& key,
                                              const KeyValues& query, const KeyValues& headers, const Body& body,
                                              const std::string& payload_sha256) {
  if (!curl_.ok()) return Fail(Error::Internal(method + " " + Describe(key) + ": libcurl could not start"));
  CURL* curl = curl_.get();
  http_client::CurlPolicy policy;
  policy.connect_timeout = std::chrono::seconds(10);
  policy.low_speed_bytes = 1;  // a transfer that moves nothing for a minute is dead
  policy.low_speed_time = std::chrono::seconds(60);
  policy.proxy = http_client::Proxy::kFromEnvironment;
  policy.ca_file = ca_file_;
  curl_.Prepare(policy);
  HttpRequestSpec spec = BuildS3Request(endpoint_, credentials_, method, bucket_, key, query, headers,
                                        std::chrono::system_clock::now(), payload_sha256);
  http_client::CurlStringList list;
  for (const auto& [k, v] : spec.headers) list.Add(k + ": " + v);
  list.Add("Expect:");  // no 100-continue round trip
  Response r;
  curl_easy_setopt(curl, CURLOPT_URL, spec.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &r.headers);
  MemoryReader mem{body.bytes};
  FILE* file = nullptr;
  if (method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (method == "PUT" || method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    if (!body.file.empty()) {
      file = std::fopen(body.file.c_str(), "rb");
      if (!file) {
        return Fail(Error::Io(body.file + ": cannot open for upload"));
      }
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadFile);
      curl_easy_setopt(curl, CURLOPT_READDATA, file);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.file_size));
    } else {
      curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadMemory);
      curl_easy_setopt(curl, CURLOPT_READDATA, &mem);
      curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.bytes.size()));
    }
    if (method == "POST") curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  CURLcode rc = curl_.Perform();
  if (file) std::fclose(file);
  if (rc != CURLE_OK) {
    const std::string detail = curl_.ErrorDetail();
    return Fail(Error::Unavailable(method + " " + Describe(key) + ": " + (detail.empty() ? curl_easy_strerror(rc) : detail)));
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  if (r.status >= 200 && r.status < 300) return r;
  std::string said = method == "HEAD" ? "HTTP " + std::to_string(r.status) : ServerSaid(r.body);
  std::string where = method + " " + Describe(key) + ": HTTP " + std::to_string(r.status) + " " + said;
  if (r.status == 501) return Fail(Error::InvalidArgument(where + " (the server does not implement this call)"));
  if (r.status >= 500 || r.status == 429) return Fail(Error::Unavailable(where));
  if (r.status == 403) return Fail(Error::PermissionDenied(where + " (check the credentials and the bucket policy)"));
  if (r.status == 404) {
    if (said.starts_with("NoSuchBucket")) return Fail(Error::NotFound(where + " (the bucket does not exist)"));
    return Fail(Error::NotFound(where));
  }
  return Fail(Error::InvalidArgument(where));
}

Result<S3Uploader::Response> S3Uploader::SendWithRetry(const std::string& what, const std::string& method,
                                                       const std::string& key, const KeyValues& query,
                                                       const KeyValues& headers, const Body& body,
                                                       const std::string& payload_sha256) {
  std::mt19937_64 rng(std::random_device{}());
  for (int failures = 0;;) {
    auto r = Send(method, key, query, headers, body, payload_sha256);
    if (r || !IsRetryable(r.error())) return r;
    ++failures;
    if (failures >= retry_.max_attempts)
      return Fail(r.error().WithContext(what + ": gave up after " + std::to_string(failures) + " attempts"));
    auto delay = retry_.Delay(failures, std::nullopt, rng);
    log::Warn(what + ": " + r.error().message() + "; retrying in " + std::to_string(delay.count()) + " ms");
    std::this_thread::sleep_for(delay);
  }
}

Status S3Uploader::CheckBucket(const std::string& probe_key) {
  // A HEAD has no body to quote, and listings are not what every S3-compatible
  // store implements alike; one byte of a key names the fault in S3's words.
  auto r = SendWithRetry("reaching s3://" + bucket_, "GET", probe_key, {}, {{"range", "bytes=0-0"}}, {}, "");
  if (r) return Ok();
  const std::string& m = r.error().message();
  bool no_such_key = r.error().code() == ErrorCode::kNotFound && m.find("NoSuchBucket") == std::string::npos;
  // 416: the probed object exists but is empty.
  if (no_such_key || m.find("HTTP 416") != std::string::npos) return Ok();
  return Fail(r.error());
}

Result<std::optional<S3ObjectHead>> S3Uploader::Head(const std::string& key) {
  auto r = SendWithRetry("HEAD " + Describe(key), "HEAD", key, {}, {}, {}, "");
  if (!r) {
    if (r.error().code() == ErrorCode::kNotFound) return std::optional<S3ObjectHead>();
    return Fail(r.error());
  }
  S3ObjectHead head;
  head.size = std::strtoull(r->Header("content-length").c_str(), nullptr, 10);
  head.sha256 = r->Header("x-amz-meta-sha256");
  return std::optional<S3ObjectHead>(head);
}

Status S3Uploader::PutFile(const std::string& key, const std::string& path, uint64_t size, const std::string& sha256) {
  Body body;
  body.file = path;
  body.file_size = size;
  auto r = SendWithRetry("PUT " + Describe(key), "PUT", key, {}, {{"x-amz-meta-sha256", sha256}}, body, sha256);
  if (!r) return Fail(r.error());
  return Ok();
}

Status S3Uploader::PutBytes(const std::string& key, std::string_view data, const std::string& content_type) {
  Body body;
  body.bytes = data;
  std::string sha = Sha256Hex(data);
  auto r = SendWithRetry("PUT " + Describe(key), "PUT", key, {},
                         {{"content-type", content_type}, {"x-amz-meta-sha256", sha}}, body, sha);
  if (!r) return Fail(r.error());
  return Ok();
}

Result<std::string> S3Uploader::CreateMultipartUpload(const std::string& key, const std::string& sha256) {
  auto r = SendWithRetry("starting the multipart upload of " + Describe(key), "POST", key, {{"uploads", ""}},
                         {{"x-amz-meta-sha256", sha256}}, {}, "");
  if (!r) return Fail(r.error());
  std::string id = XmlField(r->body, "UploadId");
  if (id.empty()) return Fail(Error::Io("POST " + Describe(key) + "?uploads: no UploadId in the answer"));
  return id;
}

Result<std::string> S3Uploader::UploadPart(const std::string& key, const std::string& upload_id, int number,
                                           std::string_view data) {
  Body body;
  body.bytes = data;
  auto r = SendWithRetry("part " + std::to_string(number) + " of " + Describe(key), "PUT", key,
                         {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}}, {}, body,
                         Sha256Hex(data));
  if (!r) return Fail(r.error());
  std::string etag = r->Header("etag");
  if (etag.empty()) return Fail(Error::Io("part " + std::to_string(number) + " of " + Describe(key) + ": no ETag"));
  return etag;
}

Status S3Uploader::CompleteMultipartUpload(const std::string& key, const std::string& upload_id,
                                           const std::vector<S3CompletedPart>& parts) {
  std::string xml = "<CompleteMultipartUpload>";
  for (const auto& p : parts)
    xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>" + Quote(p.etag) + "</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  Body body;
  body.bytes = xml;
  auto r = SendWithRetry("completing the upload of " + Describe(key), "POST", key, {{"uploadId", upload_id}},
                         {{"content-type", "application/xml"}}, body, Sha256Hex(xml));
  if (!r) return Fail(r.error());
  // S3 may answer 200 with an error document after a long assembly.
  if (r->body.find("<Error>") != std::string::npos)
    return Fail(Error::Unavailable("completing the upload of " + Describe(key) + ": " + ServerSaid(r->body)));
  return Ok();
}

Status S3Uploader::AbortMultipartUpload(const std::string& key, const std::string& upload_id) {
  auto r = SendWithRetry("aborting the upload of " + Describe(key), "DELETE", key, {{"uploadId", upload_id}}, {}, {},
                         "");
  if (!r && r.error().code() != ErrorCode::kNotFound) return Fail(r.error());
  return Ok();
}

}  // namespace moeserve::storage

#include "moeserve/budget/hook_sender.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "moeserve/http_client/curl_easy.hpp"
#include "moeserve/http_client/url_parts.hpp"

namespace moeserve {

namespace {

size_t Discard(char*, size_t size, size_t n, void*) { return size * n; }

std::string Joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

}  // namespace

std::string HmacSha256Hex(const std::string& secret, const std::string& body) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(body.data()),
       body.size(), mac, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += {kHex[mac[i] >> 4], kHex[mac[i] & 15]};
  return out;
}

std::string HookSignature(const std::string& secret, int64_t timestamp, const std::string& delivery_id,
                          const std::string& body) {
  return "sha256=" + HmacSha256Hex(secret, std::to_string(timestamp) + "." + delivery_id + "." + body);
}

HookSendResult SendHook(const HookConfig& hook, const std::string& delivery_id, const std::string& body,
                        double timeout_seconds) {
  HookSendResult r;
  const std::string who = "hook '" + hook.name + "'";
  const auto url = http_client::ParseUrl(hook.url);
  if (!url) {
    r.refused = true;
    r.error = who + ": the URL does not parse";
    return r;
  }
  const std::string where = who + " (" + url->host + ")";
  if (url->scheme != "https" && !(url->scheme == "http" && hook.allow_http)) {
    r.refused = true;
    r.error = where + ": scheme " + url->scheme + " is not allowed (https, or http with allowHTTP)";
    return r;
  }
  http_client::CurlEasy curl;
  if (!curl.ok()) {
    r.error = where + ": curl_easy_init failed";
    return r;
  }
  http_client::CurlPolicy policy;
  policy.protocols = hook.allow_http ? "http,https" : "https";
  policy.max_redirects = 0;
  policy.proxy = http_client::Proxy::kNever;
  policy.user_agent = "moeserve-hooks/1";
  policy.timeout = std::chrono::milliseconds(static_cast<long>(timeout_seconds * 1000));
  policy.connect_timeout = std::chrono::milliseconds(static_cast<long>(std::min(timeout_seconds, 5.0) * 1000));
  policy.guard.public_only = !hook.allow_private_addresses;
  curl.Prepare(policy);
  CURL* c = curl.get();
  http_client::CurlStringList headers;
  headers.Add("Content-Type: application/json");
  // Each attempt is signed afresh at its own time: a receiver that keeps a
  // tolerance window and the ids it has seen refuses a captured delivery
  // played again.
  const int64_t timestamp = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
  headers.Add("X-MoE-Timestamp: " + std::to_string(timestamp));
  headers.Add("X-MoE-Delivery: " + delivery_id);
  headers.Add("X-MoE-Signature: " + HookSignature(hook.secret, timestamp, delivery_id, body));
  headers.Add("Expect:");
  curl_easy_setopt(c, CURLOPT_URL, hook.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Discard);
  const CURLcode rc = curl.Perform();
  const long status = curl.ResponseCode();
  r.http_status = static_cast<int>(status);
  if (rc != CURLE_OK && !curl.RefusedAddresses().empty()) {
    r.refused = true;
    r.error = where + ": refused to connect to " + Joined(curl.RefusedAddresses()) +
              " (loopback, link-local and private addresses need allowPrivateAddresses)";
    return r;
  }
  if (rc != CURLE_OK) {
    r.error = where + ": " + curl_easy_strerror(rc);
    return r;
  }
  r.delivered = status >= 200 && status < 300;
  if (!r.delivered) r.error = where + ": answered HTTP " + std::to_string(status) + (status >= 300 && status < 400 ? " (redirects are not followed)" : "");
  return r;
}

}  // namespace moeserve

#include "moeserve/http_client/url_parts.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <memory>

namespace moeserve::http_client {

std::optional<UrlParts> ParseUrl(const std::string& url) {
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> u(curl_url(), curl_url_cleanup);
  if (!u || curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return std::nullopt;
  auto get = [&](CURLUPart part, std::string& into, unsigned flags) {
    char* v = nullptr;
    if (curl_url_get(u.get(), part, &v, flags) != CURLUE_OK) return false;
    into = v;
    curl_free(v);
    return true;
  };
  UrlParts p;
  if (!get(CURLUPART_SCHEME, p.scheme, 0) || !get(CURLUPART_HOST, p.host, 0) ||
      !get(CURLUPART_PORT, p.port, CURLU_DEFAULT_PORT))
    return std::nullopt;
  if (p.host.size() > 2 && p.host.front() == '[' && p.host.back() == ']') p.host = p.host.substr(1, p.host.size() - 2);
  auto lower = [](std::string& s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  };
  lower(p.scheme);
  lower(p.host);
  return p;
}

}  // namespace moeserve::http_client

// A URL's scheme, host and port as libcurl itself parses them, so that a
// check made on them (an allowed scheme, a listed host) is a check on what
// the transfer really uses, not on a second parser's reading.
//
// Thread safety: a pure function.
#pragma once

#include <optional>
#include <string>

namespace moeserve::http_client {

struct UrlParts {
  std::string scheme;  // lower case
  std::string host;    // lower case; an IPv6 literal without its brackets
  std::string port;    // the scheme's default when the URL names none
};

// nullopt when libcurl's parser refuses the URL.
std::optional<UrlParts> ParseUrl(const std::string& url);

}  // namespace moeserve::http_client

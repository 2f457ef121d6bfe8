// The bytes of HTTP/1.1 responses as the connection writes them: whole
// responses with Content-Length, and chunked streams (head, chunks, last chunk).
#pragma once

#include <string>
#include <string_view>

#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

std::string WholeResponseBytes(const HttpResponse& response, bool close);
std::string StreamHeadBytes(int status, const std::string& content_type, const HttpHeaders& headers, bool close);
std::string ChunkBytes(std::string_view data);

}  // namespace moeserve::daemon

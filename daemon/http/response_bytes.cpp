#include "response_bytes.hpp"

#include <cstdio>

namespace moeserve::daemon {
namespace {

// Header values come from our own code, but a CR or LF in one would split the
// response: drop them rather than trust every caller.
void AppendHeader(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  for (char c : value) {
    if (c != '\r' && c != '\n') out.push_back(c);
  }
  out.append("\r\n");
}

std::string StatusLine(int status) {
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(HttpReasonPhrase(status)) + "\r\n";
}

}  // namespace

std::string WholeResponseBytes(const HttpResponse& r, bool close) {
  std::string out = StatusLine(r.status);
  if (!r.content_type.empty()) AppendHeader(out, "Content-Type", r.content_type);
  for (const auto& [name, value] : r.headers) AppendHeader(out, name, value);
  AppendHeader(out, "Content-Length", std::to_string(r.body.size()));
  if (close) AppendHeader(out, "Connection", "close");
  out.append("\r\n");
  out.append(r.body);
  return out;
}

std::string StreamHeadBytes(int status, const std::string& content_type, const HttpHeaders& headers, bool close) {
  std::string out = StatusLine(status);
  if (!content_type.empty()) AppendHeader(out, "Content-Type", content_type);
  for (const auto& [name, value] : headers) AppendHeader(out, name, value);
  AppendHeader(out, "Transfer-Encoding", "chunked");
  if (close) AppendHeader(out, "Connection", "close");
  out.append("\r\n");
  return out;
}

std::string ChunkBytes(std::string_view data) {
  if (data.empty()) return std::string();  // an empty chunk would end the stream
  char size[24];
  int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out(size, static_cast<size_t>(n));
  out.append(data);
  out.append("\r\n");
  return out;
}

}  // namespace moeserve::daemon

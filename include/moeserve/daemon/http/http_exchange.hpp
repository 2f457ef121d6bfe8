// One HTTP request and the channel its answer goes back on, as the daemon's
// handlers see them. The server (http_server.hpp) parses and bounds the
// request; a handler answers through HttpExchange, now or later and from any
// thread (the scheduler thread answers most chat completions).
//
// Thread safety: HttpHead and HttpResponse are plain values. Every
// HttpExchange method may be called from any thread; the calls are queued to
// the connection in the order they were made.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::daemon {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The request line and headers, before any of the body has been read.
struct HttpHead {
  std::string method;  // "GET", "POST", ...
  std::string path;    // "/v1/chat/completions" (percent-decoding is the handler's business)
  std::string query;   // after '?', without it
  HttpHeaders headers;  // names lower-case, in arrival order
  std::optional<uint64_t> content_length;
  bool chunked = false;

  bool has_body() const { return chunked || content_length.value_or(0) > 0; }
  // The first value of a header (name in lower case), or "" when absent.
  std::string Header(std::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;  // extra headers (Retry-After, ...)
  std::string body;
};

// What a completion's answer was, told to the exchange before the answer
// goes out: the audit log records it (audit_exchange.hpp).
struct CompletionNote {
  std::string id;    // chatcmpl-...
  std::string tier;  // the tier it ran at (after any downgrade)
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, reasoning_tokens = 0;
};

// The standard reason phrase of a status code ("Payload Too Large").
std::string_view HttpReasonPhrase(int status);

class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // The whole answer at once. Only the first Reply or BeginStream counts.
  virtual void Reply(HttpResponse response) = 0;

  // A streamed answer (chunked transfer encoding): the head now, then Write
  // for each piece and EndStream to finish.
  virtual void BeginStream(int status, std::string content_type, HttpHeaders headers) = 0;
  enum class WriteResult {
    kQueued,      // will be sent
    kClientGone,  // the client hung up (or was cut off before): nothing more will be sent
    kTooSlow,     // the client reads so slowly that the unsent bytes would pass the bound:
                  // the connection is closed and OnClientGone's callback runs
  };
  virtual WriteResult Write(std::string data) = 0;
  virtual void EndStream() = 0;

  // `callback` runs once, on a server thread, when the client hangs up (or is
  // cut off for reading too slowly) before the answer has been sent in full;
  // at once if that has already happened. It is how a request stops its work.
  virtual void OnClientGone(std::function<void()> callback) = 0;
  virtual bool client_gone() const = 0;

  // Facts about the answer for an exchange that records them; a wrapping
  // exchange passes it on. Ignored by default.
  virtual void NoteCompletion(const CompletionNote&) {}
};

}  // namespace moeserve::daemon

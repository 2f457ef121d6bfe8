// What an exchange needs of its connection: each call queues work on the
// connection's strand, so it is safe from any thread.
#pragma once

#include <string>

#include "moeserve/daemon/http/http_exchange.hpp"

namespace moeserve::daemon {

class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  virtual void PostReply(HttpResponse response) = 0;
  virtual void PostBeginStream(int status, std::string content_type, HttpHeaders headers) = 0;
  // `accounted`: the bytes the exchange counts as unsent until written.
  virtual void PostChunk(std::string data, size_t accounted) = 0;
  virtual void PostEndStream() = 0;
  virtual void PostClose() = 0;
};

}  // namespace moeserve::daemon

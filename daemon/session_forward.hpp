// Forwarding of a session request to the replica that owns the session
// (session_service.hpp): the same method, path, query, body and
// Authorization, plus `forwarded_header`, sent with libcurl from a thread of
// its own; the answer comes back as it arrives (a stream event by event).
// An unreachable peer is 503 unavailable; a client that hangs up aborts the
// transfer, which the peer sees as a hang-up too.
//
// Thread safety: a free function; the exchange is used from the forwarding
// thread.
#pragma once

#include <memory>
#include <string>

#include "moeserve/daemon/http_exchange.hpp"

namespace moeserve::daemon {

void ForwardToPeer(const std::string& base_url, const HttpHead& head, std::string body,
                   std::shared_ptr<HttpExchange> exchange, const char* forwarded_header);

}  // namespace moeserve::daemon

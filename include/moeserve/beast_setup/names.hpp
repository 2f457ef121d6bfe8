// The Boost headers and names both Beast servers (daemon/http/http_server.cpp,
// operator/admission/webhook_server.cpp) are written in, spelled once. A
// server's .cpp says `using namespace moeserve::beast_setup::names;`.
#pragma once

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace moeserve::beast_setup::names {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

}  // namespace moeserve::beast_setup::names

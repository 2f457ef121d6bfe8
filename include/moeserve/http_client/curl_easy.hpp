// The one wrapper every HTTP client in the tree goes through to libcurl
// (hook deliveries, the weight puller's http(s)/S3 sources, the publisher's
// S3 uploads, session forwarding between replicas, the operator's Vault
// client and daemon admin calls, moectl's daemon reads).
//
// A CurlPolicy says what one transfer may do: how long it may take, which
// schemes it may speak, whether and where it follows redirects, whether a
// proxy from the environment applies, which certificates it trusts, and
// which addresses it may connect to (`guard`, address_guard.hpp).
// CurlEasy::Prepare applies it on a fresh (or reset) handle, together with
// what every transfer here needs: no signals (the handle is used from worker
// threads) and an error buffer for messages. A caller then sets only what is
// its own (the URL, method, headers, body and any callbacks) and performs.
// CurlFetch does the whole exchange for a request and answer that fit in
// memory.
//
// libcurl's process-wide initialisation happens once, on the first handle.
//
// Thread safety: a CurlEasy belongs to one thread at a time; CurlFetch may
// be called from any thread.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/http_client/address_guard.hpp"

namespace moeserve::http_client {

enum class Proxy {
  kNever,            // connect directly, whatever HTTP(S)_PROXY says
  kFromEnvironment,  // libcurl's default: http_proxy, HTTPS_PROXY, NO_PROXY apply
};

struct CurlPolicy {
  std::chrono::milliseconds timeout{0};          // the whole transfer; 0: no limit
  std::chrono::milliseconds connect_timeout{0};  // 0: libcurl's default (300 s)
  // A transfer slower than low_speed_bytes per second for low_speed_time is
  // given up (0: no such check).
  long low_speed_bytes = 0;
  std::chrono::seconds low_speed_time{0};
  std::string protocols;  // schemes allowed, "https" or "http,https"; empty: libcurl's default
  // Redirects: not followed unless max_redirects > 0 (a 3xx is then the
  // answer); when followed, only to redirect_protocols (empty: libcurl's
  // default, http/https/ftp/ftps).
  long max_redirects = 0;
  std::string redirect_protocols;
  Proxy proxy = Proxy::kNever;
  std::string ca_file;  // trust this PEM file instead of the system's store
  std::string ca_pem;   // or these PEM bytes
  // false: the chain is checked against the trusted certificates but not the
  // host name (a pod addressed by IP under a certificate that names its
  // Service).
  bool verify_host = true;
  bool tcp_keepalive = false;
  std::string user_agent;  // empty: none sent
  // Checked on every socket the transfer opens (CURLOPT_OPENSOCKETFUNCTION),
  // on the address libcurl resolved and is about to connect to. A guard that
  // refuses private addresses also turns any proxy off (a proxy would be
  // the address checked, and it could connect anywhere). A refused address
  // fails that connection attempt (libcurl tries the name's next address);
  // the refused ones are listed by RefusedAddresses and CurlAnswer.
  AddressGuard guard;
};

// A libcurl string list (request headers "Name: value", CURLOPT_RESOLVE
// entries), freed with the object.
class CurlStringList {
 public:
  CurlStringList() = default;
  CurlStringList(const CurlStringList&) = delete;
  CurlStringList& operator=(const CurlStringList&) = delete;
  ~CurlStringList();
  CurlStringList& Add(const std::string& line);
  curl_slist* get() const { return list_; }

 private:
  curl_slist* list_ = nullptr;
};

class CurlEasy {
 public:
  CurlEasy();
  CurlEasy(const CurlEasy&) = delete;
  CurlEasy& operator=(const CurlEasy&) = delete;
  ~CurlEasy();

  // False when libcurl could not make a handle (out of memory).
  bool ok() const { return curl_ != nullptr; }
  CURL* get() const { return curl_; }

  // Resets every option (the connection cache stays) and applies `policy`.
  // A caller must not set CURLOPT_OPENSOCKETFUNCTION on a guarded handle.
  void Prepare(const CurlPolicy& policy);
  CURLcode Perform();
  // The addresses the policy's guard refused to connect to during the last
  // Perform, in the order tried (text, address_guard.hpp); empty if none.
  // A failed Perform with refused addresses was stopped by the guard.
  const std::vector<std::string>& RefusedAddresses() const { return guard_.refused; }
  long ResponseCode() const;
  // What went wrong, for messages: libcurl's error buffer of the last
  // Perform (it names hosts and addresses), "" when it said nothing.
  std::string ErrorDetail() const { return errbuf_; }

 private:
  static curl_socket_t OpenGuardedSocket(void* clientp, curlsocktype purpose, curl_sockaddr* address);

  // What the socket callback reads and writes; its address is the
  // callback's data, so a CurlEasy is neither copied nor moved.
  struct GuardState {
    CURL* curl = nullptr;
    AddressGuard guard;
    std::vector<std::string> refused;
  };

  CURL* curl_ = nullptr;
  char errbuf_[CURL_ERROR_SIZE] = {0};
  GuardState guard_;
};

// A request that fits in memory, and its answer.
struct CurlCall {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::optional<std::string> body;   // sent as is, with its length
  size_t max_answer_bytes = 16 << 20;
};

struct CurlAnswer {
  CURLcode code = CURLE_OK;  // the transfer's result (CURLE_OK: an answer came)
  std::string error;         // curl_easy_strerror(code); "" when CURLE_OK
  std::string detail;        // libcurl's error buffer, often more precise; may be ""
  long status = 0;           // the HTTP status, 0 when none came
  std::string body;
  bool too_large = false;    // the body passed max_answer_bytes (code is CURLE_WRITE_ERROR)
  std::vector<std::string> refused_addresses;  // CurlEasy::RefusedAddresses of the transfer
};

// Performs `call` under `policy`; never throws. A failure to start libcurl
// is code CURLE_FAILED_INIT.
CurlAnswer CurlFetch(const CurlCall& call, const CurlPolicy& policy);

}  // namespace moeserve::http_client

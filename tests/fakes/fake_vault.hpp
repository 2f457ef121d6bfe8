// FakeVault: a HashiCorp Vault double over HTTP on 127.0.0.1, following
// Vault's HTTP API documentation for what the operator uses:
//
//   POST /v1/auth/<mount>/login           Kubernetes auth: {"role","jwt"}. The
//       JWT is checked as Vault does, by a TokenReview against the API
//       double (with the role's audience), then the reviewed service account
//       must be one of the role's bound names and namespaces.
//   POST /v1/auth/token/renew-self        extends the caller's token (capped at max TTL)
//   POST /v1/auth/token/revoke-self       revokes it (204)
//   GET  /v1/auth/token/lookup-self       describes it
//   GET  /v1/<mount>/data/<path>          KV v2 read: data.data, data.metadata
//       {created_time, custom_metadata, deletion_time, destroyed, version};
//       ?version=N; a soft-deleted or destroyed current version is a 404
//       that still carries data.metadata, as Vault answers.
//
// Errors are Vault's `{"errors":[...]}` bodies: 400 (bad request, unknown
// role), 403 (`permission denied`; outside a policy: "1 error
// occurred:\n\t* permission denied\n\n"), 404 (`{"errors":[]}`), 503 when
// sealed (`Vault is sealed`). Policies are path patterns per role with
// Vault's glob rules: a trailing `*` is a prefix, `+` one path segment.
//
// Tokens ("hvs." + random) carry the role's policies (a role changed later
// applies to its tokens at once, as a changed policy does in Vault) and
// really expire: TTL and max TTL run on a clock the test moves with Advance().
//
// Faults: the next n requests answered with a given status (5xx retries),
// every response delayed (timeouts), a KV read answered with a huge body
// (PadAnswer: streamed in chunks, never held in memory, so a test can send
// far more than any client should read). Everything asked is recorded.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "http_server.hpp"

namespace moeserve::fakes {

struct FakeVaultRole {
  std::vector<std::string> bound_service_account_names;       // "*" for any
  std::vector<std::string> bound_service_account_namespaces;  // "*" for any
  std::string audience;                                       // "" = the API server's default
  std::vector<std::string> read_paths;                        // policy: paths with read
  int64_t token_ttl_s = 3600, token_max_ttl_s = 86400;
};

struct FakeVaultRequest {
  std::string method, path;
  std::string vault_namespace;  // X-Vault-Namespace
  bool had_token = false;
  int status = 0;
};

class FakeVault {
 public:
  // `kube_url`: the API server that reviews service-account tokens.
  explicit FakeVault(std::string kube_url, std::string auth_mount = "kubernetes");
  ~FakeVault();
  int Start(int port = 0);  // returns the port, or -1
  void Stop();
  std::string url() const;

  void SetRole(const std::string& name, FakeVaultRole role);
  // A token made directly (as `vault token create`), with read on these paths.
  std::string CreateToken(std::vector<std::string> read_paths, int64_t ttl_s, int64_t max_ttl_s = 86400);

  // KV v2 at <mount>/data/<path>: writes a new version, returns its number.
  int Put(const std::string& mount, const std::string& path, const std::map<std::string, std::string>& data);
  void SoftDeleteLatest(const std::string& mount, const std::string& path);
  void DestroyLatest(const std::string& mount, const std::string& path);

  void SetSealed(bool sealed);
  void Advance(std::chrono::seconds by);
  // The next `count` requests are answered `status` with `{"errors":[text]}`.
  void FailNext(int count, int status, const std::string& text);
  void SetDelay(std::chrono::milliseconds delay);
  // Reads of <mount>/data/<path> that Vault would answer 200 carry an extra
  // key `padding` of `bytes` characters, streamed (chunked) until sent or
  // the client hangs up. 0 turns it off.
  void PadAnswer(const std::string& mount, const std::string& path, size_t bytes);
  // Padding bytes written to the socket so far (a client that stops reading
  // makes this stop short of what PadAnswer asked).
  size_t PaddingSent() const;

  bool TokenValid(const std::string& token) const;
  std::vector<FakeVaultRequest> Requests() const;
  size_t Count(const std::string& method, const std::string& path_prefix) const;
  // Tokens handed out by logins, oldest first.
  std::vector<std::string> LoginTokens() const;

 private:
  struct Token {
    std::vector<std::string> read_paths;
    std::string role, accessor;
    std::chrono::system_clock::time_point created, expires, max_expires;
    int64_t ttl_s = 0;
    bool revoked = false;
    nlohmann::json metadata = nlohmann::json::object();
  };
  struct Version {
    std::map<std::string, std::string> data;
    std::string created_time, deletion_time;
    bool destroyed = false;
  };
  struct Reply {
    int status = 200;
    nlohmann::json body;  // null: no body (204)
    size_t padding = 0;   // PadAnswer's bytes to stream inside data.data
  };

  void Handle(const HttpRequest& request, HttpResponseWriter& writer);
  Reply Route(const HttpRequest& request);
  Reply Login(const std::string& body);
  Reply Renew(const std::string& token);
  Reply LookupSelf(const std::string& token);
  Reply ReadKv(const std::string& token, const std::string& path, const std::string& version);
  std::chrono::system_clock::time_point Now() const;  // under mu_
  Token* Live(const std::string& token);               // under mu_
  nlohmann::json AuthBlock(const std::string& token, const Token& t, const std::vector<std::string>& warnings = {});
  std::string IssueToken(Token t);  // under mu_

  const std::string kube_url_, auth_mount_;
  HttpServer http_;
  mutable std::mutex mu_;
  std::map<std::string, FakeVaultRole> roles_;
  std::map<std::string, Token> tokens_;
  std::vector<std::string> login_tokens_;
  std::map<std::string, std::vector<Version>> kv_;  // "<mount>/<path>" -> versions from 1
  bool sealed_ = false;
  std::chrono::seconds offset_{0};
  int fail_count_ = 0, fail_status_ = 0;
  std::string fail_text_;
  std::chrono::milliseconds delay_{0};
  std::map<std::string, size_t> padded_;  // "<mount>/data/<path>" -> bytes
  size_t padding_sent_ = 0;
  std::vector<FakeVaultRequest> requests_;
};

}  // namespace moeserve::fakes

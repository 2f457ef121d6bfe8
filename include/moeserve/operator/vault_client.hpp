// A HashiCorp Vault client for the operator, over libcurl: Kubernetes auth
// login, token renewal, lookup and revocation, and KV version 2 reads. It
// holds no token itself (VaultSessions does); each call names the token.
//
// Configuration as Vault's own tools read it: VAULT_ADDR, VAULT_CACERT (the
// CA that signs Vault's certificate), VAULT_NAMESPACE (sent as
// X-Vault-Namespace on every request).
//
// Only https is spoken: tokens, logins (a service account's JWT) and secret
// values cross this connection. An http:// address is refused (every call
// fails with kInvalidArgument, CheckVaultAddress says why) unless
// allow_insecure_http is set, which is for a development Vault on loopback
// and for tests (moe-operator --vault-allow-insecure-http).
//
// Errors carry Vault's own text from its `{"errors":[...]}` body (whitespace
// folded to one line), and a code that says what a caller does next:
// 400 kInvalidArgument, 403 kPermissionDenied, 404 kNotFound, 429/5xx
// (sealed, standby, overloaded) and transport failures kUnavailable, a passed
// deadline kTimeout, an answer past max_answer_bytes kResourceExhausted (not
// retried: the transfer stops there, and asking again gets the same answer). 5xx, 429, transport failures and timeouts are retried
// with exponential backoff (attempts, backoff_initial doubling) before they
// are returned. No message ever holds a token or a secret's value.
//
// Thread safety: a VaultClient may be used from many threads at once (each
// call uses its own curl handle).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

struct VaultConfig {
  std::string address;     // https://vault.example:8200 (VAULT_ADDR)
  std::string ca_cert;     // PEM file (VAULT_CACERT); "" = the system's CAs
  std::string vault_namespace;  // Vault Enterprise namespace (VAULT_NAMESPACE); "" = none
  std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
  int attempts = 3;  // per call, for retryable failures
  std::chrono::milliseconds backoff_initial{200};
  bool allow_insecure_http = false;  // development only: accept an http:// address
  // The largest answer read (moe-operator --vault-max-answer-bytes): a KV
  // answer is a few keys; a huge one (a misused path, a hostile proxy) is
  // refused at this size instead of growing the operator's memory.
  size_t max_answer_bytes = size_t{1} << 20;
};

// Whether `config.address` may be used: https://, or http:// with
// allow_insecure_http. The error names the address and the flag.
Status CheckVaultAddress(const VaultConfig& config);

// The environment's VAULT_ADDR, VAULT_CACERT and VAULT_NAMESPACE over `base`.
VaultConfig VaultConfigFromEnvironment(VaultConfig base = {});

// A token Vault handed out (login or renewal).
struct VaultLease {
  std::string token;
  std::chrono::seconds lease_duration{0};
  bool renewable = false;
};

// A KV v2 secret version: data.data and data.metadata.version.
struct KvSecret {
  std::map<std::string, std::string> data;
  int64_t version = 0;
};

class VaultClient {
 public:
  explicit VaultClient(VaultConfig config);

  // POST /v1/auth/<mount>/login {"role","jwt"}.
  Result<VaultLease> KubernetesLogin(const std::string& mount, const std::string& role, const std::string& jwt);
  // POST /v1/auth/token/renew-self.
  Result<VaultLease> RenewSelf(const std::string& token);
  // GET /v1/auth/token/lookup-self: Ok while the token is alive.
  Status LookupSelf(const std::string& token);
  // POST /v1/auth/token/revoke-self.
  Status RevokeSelf(const std::string& token);
  // GET /v1/<path>, path being the API path after /v1/ (KV v2: <mount>/data/<name>).
  // A deleted or destroyed current version is kNotFound. Values that are
  // not strings are refused (kInvalidArgument): they could not be files.
  Result<KvSecret> ReadKv(const std::string& token, const std::string& path);

  const VaultConfig& config() const { return config_; }

 private:
  struct Response {
    long status = 0;
    nlohmann::json body;
  };
  // One request with retries; `what` names it in errors.
  Result<Response> Call(const std::string& method, const std::string& path, const std::string& token,
                        const std::string& body, const std::string& what);
  Result<Response> CallOnce(const std::string& method, const std::string& path, const std::string& token,
                            const std::string& body, const std::string& what);

  VaultConfig config_;
};

// Vault's `{"errors":[...]}` as one line: "1 error occurred: * permission denied".
std::string VaultErrorText(const nlohmann::json& body);

}  // namespace moeserve::op

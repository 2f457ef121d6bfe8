#include "moeserve/operator/vault_client.hpp"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "moeserve/http_client/curl_easy.hpp"

namespace moeserve::op {

using nlohmann::json;

namespace {

bool Retryable(long status) { return status == 429 || status >= 500; }

Error ErrorFor(long status, const std::string& text) {
  switch (status) {
    case 400: return Error::InvalidArgument(text);
    case 401:
    case 403: return Error::PermissionDenied(text);
    case 404: return Error::NotFound(text);
    default: return Error::Unavailable(text);
  }
}

}  // namespace

std::string VaultErrorText(const json& body) {
  std::string joined;
  if (body.is_object() && body.contains("errors") && body["errors"].is_array())
    for (const auto& e : body["errors"])
      if (e.is_string()) joined += (joined.empty() ? "" : "; ") + e.get<std::string>();
  // Vault's multierror text spans lines ("1 error occurred:\n\t* ..."):
  // one line reads better in a condition and a log.
  std::string out;
  bool space = false;
  for (char c : joined) {
    if (c == '\n' || c == '\t' || c == '\r' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

VaultConfig VaultConfigFromEnvironment(VaultConfig base) {
  if (const char* v = std::getenv("VAULT_ADDR"); v && *v) base.address = v;
  if (const char* v = std::getenv("VAULT_CACERT"); v && *v) base.ca_cert = v;
  if (const char* v = std::getenv("VAULT_NAMESPACE"); v && *v) base.vault_namespace = v;
  return base;
}

Status CheckVaultAddress(const VaultConfig& config) {
  auto starts = [&](const char* scheme) {
    const std::string& a = config.address;
    const size_t n = std::strlen(scheme);
    if (a.size() < n) return false;
    for (size_t i = 0; i < n; ++i)
      if (std::tolower(static_cast<unsigned char>(a[i])) != scheme[i]) return false;
    return true;
  };
  if (starts("https://")) return Ok();
  if (starts("http://")) {
    if (config.allow_insecure_http) return Ok();
    return Fail(Error::InvalidArgument(
        "Vault address " + config.address +
        " is plain http: tokens, service-account logins and secret values would cross the network unencrypted; "
        "use https:// (with --vault-cacert for a private CA), or pass --vault-allow-insecure-http for a "
        "development Vault"));
  }
  return Fail(Error::InvalidArgument("Vault address " + config.address + ": not an https:// URL"));
}

VaultClient::VaultClient(VaultConfig config) : config_(std::move(config)) {
  while (!config_.address.empty() && config_.address.back() == '/') config_.address.pop_back();
}

Result<VaultClient::Response> VaultClient::CallOnce(const std::string& method, const std::string& path,
                                                    const std::string& token, const std::string& body,
                                                    const std::string& what) {
  http_client::CurlCall call;
  call.method = method;
  call.url = config_.address + "/v1/" + path;
  call.headers.push_back("Accept: application/json");
  if (!body.empty()) call.headers.push_back("Content-Type: application/json");
  if (!token.empty()) call.headers.push_back("X-Vault-Token: " + token);
  if (!config_.vault_namespace.empty()) call.headers.push_back("X-Vault-Namespace: " + config_.vault_namespace);
  // Vault's API asks for this header on every request (request forgery protection).
  call.headers.push_back("X-Vault-Request: true");
  if (method == "POST") call.body = body;
  call.max_answer_bytes = config_.max_answer_bytes;
  http_client::CurlPolicy policy;
  policy.timeout = policy.connect_timeout = config_.request_timeout;
  // Vault answers directly; a redirect (standby forwarding) is not followed
  // blindly with the token attached.
  policy.max_redirects = 0;
  policy.protocols = config_.allow_insecure_http ? "http,https" : "https";
  policy.proxy = http_client::Proxy::kFromEnvironment;
  policy.ca_file = config_.ca_cert;
  const http_client::CurlAnswer answer = http_client::CurlFetch(call, policy);
  if (answer.too_large)
    return Fail(Error::ResourceExhausted("Vault " + what + ": the answer is larger than " +
                                         std::to_string(config_.max_answer_bytes) +
                                         " bytes (--vault-max-answer-bytes); not read further"));
  if (answer.code == CURLE_OPERATION_TIMEDOUT)
    return Fail(Error::Timeout("Vault " + what + ": no answer within " +
                               std::to_string(config_.request_timeout.count()) + " ms"));
  if (answer.code != CURLE_OK) return Fail(Error::Unavailable("Vault " + what + ": " + answer.error));
  const long status = answer.status;
  const std::string& received = answer.body;
  Response response;
  response.status = status;
  response.body = received.empty() ? json() : json::parse(received, nullptr, false);
  if (response.body.is_discarded()) response.body = json();
  return response;
}

Result<VaultClient::Response> VaultClient::Call(const std::string& method, const std::string& path,
                                                const std::string& token, const std::string& body,
                                                const std::string& what) {
  if (config_.address.empty()) return Fail(Error::Unavailable("Vault " + what + ": no Vault address (VAULT_ADDR)"));
  MOE_TRY(CheckVaultAddress(config_));
  auto backoff = config_.backoff_initial;
  for (int attempt = 1;; ++attempt) {
    auto response = CallOnce(method, path, token, body, what);
    const bool last = attempt >= std::max(1, config_.attempts);
    if (response) {
      if (response->status < 300) return response;
      std::string text = VaultErrorText(response->body);
      const json metadata = response->body.is_object() && response->body.contains("data") &&
                                    response->body["data"].is_object()
                                ? response->body["data"].value("metadata", json())
                                : json();
      // KV v2 answers a deleted or destroyed current version with a 404 and its metadata.
      if (text.empty() && response->status == 404 && metadata.is_object())
        text = "version " + std::to_string(metadata.value("version", int64_t{0})) +
               (metadata.value("destroyed", false) ? " is destroyed" : " is deleted");
      if (text.empty() && response->status == 404) text = "no secret at this path";
      if (text.empty()) text = "HTTP " + std::to_string(response->status);
      if (!Retryable(response->status) || last)
        return Fail(ErrorFor(response->status, "Vault " + what + ": " + text));
    } else {
      const ErrorCode code = response.error().code();
      if ((code != ErrorCode::kUnavailable && code != ErrorCode::kTimeout) || last) return Fail(response.error());
    }
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
}

namespace {

Result<VaultLease> LeaseOf(const json& body, const std::string& what) {
  const json auth = body.is_object() ? body.value("auth", json()) : json();
  if (!auth.is_object() || !auth.contains("client_token") || !auth["client_token"].is_string())
    return Fail(Error::Unavailable("Vault " + what + ": the answer holds no auth.client_token"));
  VaultLease lease;
  lease.token = auth["client_token"].get<std::string>();
  lease.lease_duration = std::chrono::seconds(auth.value("lease_duration", int64_t{0}));
  lease.renewable = auth.value("renewable", false);
  return lease;
}

}  // namespace

Result<VaultLease> VaultClient::KubernetesLogin(const std::string& mount, const std::string& role,
                                                const std::string& jwt) {
  const std::string what = "login at auth/" + mount + " as role " + role;
  MOE_ASSIGN_OR_RETURN(Response r, Call("POST", "auth/" + mount + "/login", "",
                                        json({{"role", role}, {"jwt", jwt}}).dump(), what));
  return LeaseOf(r.body, what);
}

Result<VaultLease> VaultClient::RenewSelf(const std::string& token) {
  MOE_ASSIGN_OR_RETURN(Response r, Call("POST", "auth/token/renew-self", token, "{}", "token renewal"));
  return LeaseOf(r.body, "token renewal");
}

Status VaultClient::LookupSelf(const std::string& token) {
  MOE_TRY(Call("GET", "auth/token/lookup-self", token, "", "token lookup"));
  return Ok();
}

Status VaultClient::RevokeSelf(const std::string& token) {
  MOE_TRY(Call("POST", "auth/token/revoke-self", token, "{}", "token revocation"));
  return Ok();
}

Result<KvSecret> VaultClient::ReadKv(const std::string& token, const std::string& path) {
  const std::string what = "read " + path;
  MOE_ASSIGN_OR_RETURN(Response r, Call("GET", path, token, "", what));
  const json data = r.body.is_object() ? r.body.value("data", json()) : json();
  if (!data.is_object() || !data.contains("data") || !data["data"].is_object())
    return Fail(Error::InvalidArgument("Vault " + what + ": not a KV version 2 secret (no data.data; a KV v2 path "
                                       "names <mount>/data/<name>)"));
  KvSecret secret;
  const json metadata = data.value("metadata", json::object());
  if (metadata.is_object()) secret.version = metadata.value("version", int64_t{0});
  for (const auto& [k, v] : data["data"].items()) {
    if (!v.is_string())
      return Fail(Error::InvalidArgument("Vault " + what + ": the value of key " + k + " is not a string"));
    secret.data[k] = v.get<std::string>();
  }
  return secret;
}

}  // namespace moeserve::op

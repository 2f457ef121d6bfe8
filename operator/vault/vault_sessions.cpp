#include "moeserve/operator/vault_sessions.hpp"

#include "moeserve/common/log.hpp"

namespace moeserve::op {

VaultSessions::VaultSessions(VaultClient& vault, KubeClient& kube, VaultAuthOptions options)
    : vault_(vault), kube_(kube), options_(std::move(options)) {}

std::shared_ptr<VaultSessions::Session> VaultSessions::SessionFor(const std::string& ns, const std::string& role) {
  std::lock_guard lock(mu_);
  auto& s = sessions_[ns + "\n" + role];
  if (!s) s = std::make_shared<Session>();
  return s;
}

void VaultSessions::Adopt(Session& s, const VaultLease& lease) {
  const auto now = options_.now();
  s.token = lease.token;
  s.renewable = lease.renewable;
  if (lease.lease_duration.count() <= 0) {
    // A token without a TTL never needs renewal.
    s.renew_at = s.expires = std::chrono::steady_clock::time_point::max();
    return;
  }
  s.expires = now + lease.lease_duration;
  s.renew_at = now + lease.lease_duration * 2 / 3;
}

Status VaultSessions::Login(Session& s, const std::string& ns, const std::string& role) {
  // A fresh, short-lived token of the namespace's own Vault service account:
  // Vault reviews it with the API server and binds it to the role.
  const json request = {{"apiVersion", "authentication.k8s.io/v1"},
                        {"kind", "TokenRequest"},
                        {"spec",
                         {{"audiences", json::array({options_.audience})},
                          {"expirationSeconds", options_.service_account_token_seconds}}}};
  auto issued = kube_.CreateSubresource(resources::kServiceAccount, ns, options_.service_account, "token", request);
  if (!issued)
    return Fail(Error(issued.error().code(), "TokenRequest for ServiceAccount " + ns + "/" + options_.service_account +
                                                 ": " + issued.error().message()));
  const json status = issued->value("status", json::object());
  if (!status.is_object() || !status.contains("token") || !status["token"].is_string())
    return Fail(Error::Unavailable("TokenRequest for ServiceAccount " + ns + "/" + options_.service_account +
                                   ": the answer holds no status.token"));
  auto lease = vault_.KubernetesLogin(options_.auth_mount, role, status["token"].get<std::string>());
  if (!lease) return Fail(lease.error().WithContext("namespace " + ns));
  Adopt(s, *lease);
  s.first_lease = lease->lease_duration;
  ++logins_;
  log::Info("vault: logged in for namespace " + ns + " as role " + role + " (lease " +
            std::to_string(lease->lease_duration.count()) + " s)");
  return Ok();
}

Result<std::string> VaultSessions::Token(const std::string& ns, const std::string& role) {
  if (development()) return options_.fixed_token;
  auto session = SessionFor(ns, role);
  std::lock_guard lock(session->mu);
  Session& s = *session;
  const auto now = options_.now();
  if (!s.token.empty() && now < s.renew_at) return s.token;
  if (!s.token.empty() && now < s.expires && s.renewable) {
    auto renewed = vault_.RenewSelf(s.token);
    // Less than a third of the first lease back: the max TTL is near, and a
    // new login is due anyway.
    if (renewed && renewed->lease_duration * 3 >= s.first_lease) {
      Adopt(s, *renewed);
      ++renewals_;
      return s.token;
    }
    if (renewed) (void)vault_.RevokeSelf(s.token);  // its last minutes are not needed
    else log::Warn("vault: renewal for namespace " + ns + " as role " + role + " failed (" +
                   renewed.error().message() + "); logging in again");
  }
  s.token.clear();
  MOE_TRY(Login(s, ns, role));
  return s.token;
}

void VaultSessions::Invalidate(const std::string& ns, const std::string& role, const std::string& token) {
  if (development()) return;
  auto session = SessionFor(ns, role);
  std::lock_guard lock(session->mu);
  if (session->token == token) session->token.clear();
}

Status VaultSessions::Revoke(const std::string& ns, const std::string& role) {
  if (development()) return Ok();
  std::shared_ptr<Session> session;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(ns + "\n" + role);
    if (it == sessions_.end()) return Ok();
    session = it->second;
  }
  std::lock_guard lock(session->mu);
  if (session->token.empty()) return Ok();
  if (options_.now() < session->expires) {
    auto revoked = vault_.RevokeSelf(session->token);
    // A token Vault no longer knows (expired, revoked) is as good as revoked.
    if (!revoked && revoked.error().code() != ErrorCode::kPermissionDenied) return revoked;
  }
  session->token.clear();
  log::Info("vault: revoked the token of namespace " + ns + " role " + role);
  return Ok();
}

}  // namespace moeserve::op

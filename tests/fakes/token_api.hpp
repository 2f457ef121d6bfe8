// TokenRequest and TokenReview for the Kubernetes API double, as
// kube-apiserver serves them (authentication.k8s.io/v1):
//
//   POST /api/v1/namespaces/<ns>/serviceaccounts/<sa>/token   TokenRequest
//     spec.audiences (default: the API server's own), spec.expirationSeconds
//     (default 3600, at least 600); answers status.token and
//     status.expirationTimestamp. The service account must exist.
//   POST /apis/authentication.k8s.io/v1/tokenreviews         TokenReview
//     spec.token, spec.audiences; answers status.authenticated, user
//     (username system:serviceaccount:<ns>:<sa>, uid, groups), audiences
//     (those asked for that the token carries), or error.
//
// Tokens are random opaque strings the double remembers with their service
// account (and its uid), audiences and expiry; a review fails for an unknown
// or expired token, a token of a service account since deleted or replaced,
// or when the token carries none of the audiences asked for. Expiry follows
// a clock the test may move forward.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::fakes {

struct TokenOutcome {
  int code = 200;
  nlohmann::json body;
};

class TokenApi {
 public:
  // The audience a token gets when the request names none.
  static constexpr char kApiServerAudience[] = "https://kubernetes.default.svc.cluster.local";

  // `service_account`: the ServiceAccount object, or null when it does not exist.
  TokenOutcome Request(const std::string& ns, const std::string& name, const nlohmann::json& service_account,
                       const std::string& body);
  // `uid_of(ns, name)`: the uid of that ServiceAccount now, "" when gone.
  TokenOutcome Review(const std::string& body,
                      const std::function<std::string(const std::string&, const std::string&)>& uid_of);

  // Moves the clock that token expiry is measured on.
  void Advance(std::chrono::seconds by);
  size_t Issued() const;
  size_t Reviews() const;

 private:
  struct Token {
    std::string ns, service_account, uid;
    std::vector<std::string> audiences;
    std::chrono::system_clock::time_point expires;
  };
  std::chrono::system_clock::time_point Now() const;

  mutable std::mutex mu_;
  std::map<std::string, Token> tokens_;
  std::chrono::seconds offset_{0};
  size_t reviews_ = 0;
};

}  // namespace moeserve::fakes

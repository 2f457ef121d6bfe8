#include "token_api.hpp"

#include <algorithm>
#include <ctime>
#include <random>

namespace moeserve::fakes {

using nlohmann::json;

namespace {

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json StatusFailure(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Failure"},
          {"message", message}, {"reason", reason},   {"code", code}};
}

std::string RandomHex(size_t bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(rng() & 0xff);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::vector<std::string> Strings(const json& j) {
  std::vector<std::string> out;
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

}  // namespace

std::chrono::system_clock::time_point TokenApi::Now() const { return std::chrono::system_clock::now() + offset_; }

TokenOutcome TokenApi::Request(const std::string& ns, const std::string& name, const json& service_account,
                               const std::string& body) {
  if (service_account.is_null())
    return {404, StatusFailure(404, "NotFound", "serviceaccounts \"" + name + "\" not found")};
  const json request = json::parse(body, nullptr, false);
  if (!request.is_object()) return {400, StatusFailure(400, "BadRequest", "the body of the request was not valid JSON")};
  const json spec = request.value("spec", json::object());
  std::vector<std::string> audiences = Strings(spec.value("audiences", json::array()));
  if (audiences.empty()) audiences = {kApiServerAudience};
  const int64_t seconds = spec.value("expirationSeconds", int64_t{3600});
  if (seconds < 600)
    return {422, StatusFailure(422, "Invalid",
                               "TokenRequest.authentication.k8s.io \"" + name + "\" is invalid: spec.expirationSeconds: "
                               "Invalid value: " + std::to_string(seconds) +
                                   ": may not specify a duration less than 10 minutes")};
  std::lock_guard lock(mu_);
  const std::string token = "k8s-sa-token." + RandomHex(32);
  const auto expires = Now() + std::chrono::seconds(seconds);
  tokens_[token] = {ns, name, service_account["metadata"].value("uid", ""), audiences, expires};
  json out = {{"kind", "TokenRequest"},
              {"apiVersion", "authentication.k8s.io/v1"},
              {"metadata", {{"name", name}, {"namespace", ns}, {"creationTimestamp", Rfc3339(Now())}}},
              {"spec", {{"audiences", audiences}, {"expirationSeconds", seconds}, {"boundObjectRef", nullptr}}},
              {"status", {{"token", token}, {"expirationTimestamp", Rfc3339(expires)}}}};
  return {201, out};
}

TokenOutcome TokenApi::Review(const std::string& body,
                              const std::function<std::string(const std::string&, const std::string&)>& uid_of) {
  const json request = json::parse(body, nullptr, false);
  if (!request.is_object()) return {400, StatusFailure(400, "BadRequest", "the body of the request was not valid JSON")};
  const json spec = request.value("spec", json::object());
  const std::string presented = spec.value("token", "");
  std::vector<std::string> wanted = Strings(spec.value("audiences", json::array()));
  if (wanted.empty()) wanted = {kApiServerAudience};
  json out = {{"kind", "TokenReview"}, {"apiVersion", "authentication.k8s.io/v1"},
              {"metadata", {{"creationTimestamp", nullptr}}}, {"spec", spec}};
  auto refuse = [&](const std::string& error) {
    out["status"] = {{"authenticated", false}, {"user", json::object()}, {"error", error}};
    return TokenOutcome{201, out};
  };
  std::lock_guard lock(mu_);
  ++reviews_;
  auto it = tokens_.find(presented);
  if (presented.empty() || it == tokens_.end()) return refuse("[invalid bearer token, token lookup failed]");
  const Token& t = it->second;
  if (Now() >= t.expires) return refuse("[invalid bearer token, service account token has expired]");
  const std::string uid = uid_of(t.ns, t.service_account);
  if (uid.empty() || uid != t.uid)
    return refuse("[invalid bearer token, service account " + t.ns + "/" + t.service_account +
                  " has been deleted]");
  std::vector<std::string> common;
  for (const auto& a : wanted)
    if (std::find(t.audiences.begin(), t.audiences.end(), a) != t.audiences.end()) common.push_back(a);
  if (common.empty()) return refuse("[invalid bearer token, token audiences is invalid for the target audiences]");
  out["status"] = {{"authenticated", true},
                   {"user",
                    {{"username", "system:serviceaccount:" + t.ns + ":" + t.service_account},
                     {"uid", t.uid},
                     {"groups", json::array({"system:serviceaccounts", "system:serviceaccounts:" + t.ns,
                                             "system:authenticated"})}}},
                   {"audiences", common}};
  return {201, out};
}

void TokenApi::Advance(std::chrono::seconds by) {
  std::lock_guard lock(mu_);
  offset_ += by;
}

size_t TokenApi::Issued() const {
  std::lock_guard lock(mu_);
  return tokens_.size();
}

size_t TokenApi::Reviews() const {
  std::lock_guard lock(mu_);
  return reviews_;
}

}  // namespace moeserve::fakes

#include "fake_vault.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <sstream>
#include <thread>

namespace moeserve::fakes {

using nlohmann::json;

namespace {

constexpr char kPolicyDenied[] = "1 error occurred:\n\t* permission denied\n\n";

json Errors(std::vector<std::string> errors) { return {{"errors", std::move(errors)}}; }

std::string Rfc3339Nano(std::chrono::system_clock::time_point t) {
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(t);
  const std::time_t tt = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  snprintf(frac, sizeof frac, ".%09lld", static_cast<long long>((t - secs).count() % 1000000000));
  return std::string(buf) + frac + "Z";
}

std::string RandomId(size_t bytes) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) out.push_back(kAlnum[rng() % (sizeof kAlnum - 1)]);
  return out;
}

bool Listed(const std::vector<std::string>& allowed, const std::string& value) {
  return std::find(allowed.begin(), allowed.end(), "*") != allowed.end() ||
         std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

// Vault's policy path rules: `+` matches one segment, a trailing `*` any suffix.
bool PathMatches(const std::string& pattern, const std::string& path) {
  size_t p = 0, s = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '*' && p + 1 == pattern.size()) return true;
    if (pattern[p] == '+') {
      const size_t end = path.find('/', s);
      if (end == s) return false;
      s = end == std::string::npos ? path.size() : end;
      ++p;
      continue;
    }
    if (s >= path.size() || pattern[p] != path[s]) return false;
    ++p;
    ++s;
  }
  return s == path.size();
}

// POST to the API double on loopback; the status and body, or status 0.
std::pair<int, std::string> PostLoopback(const std::string& base_url, const std::string& path, const std::string& body) {
  const size_t colon = base_url.rfind(':');
  if (colon == std::string::npos) return {0, ""};
  const int port = std::stoi(base_url.substr(colon + 1));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return {0, ""};
  }
  const std::string request = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                              "Content-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return {0, ""};
  return {std::stoi(raw.substr(9, 3)), raw.substr(head_end + 4)};
}

}  // namespace

FakeVault::FakeVault(std::string kube_url, std::string auth_mount)
    : kube_url_(std::move(kube_url)),
      auth_mount_(std::move(auth_mount)),
      http_([this](const HttpRequest& r, HttpResponseWriter& w) { Handle(r, w); }) {}

FakeVault::~FakeVault() { Stop(); }
int FakeVault::Start(int port) { return http_.Start(port); }
void FakeVault::Stop() { http_.Stop(); }
std::string FakeVault::url() const { return "http://127.0.0.1:" + std::to_string(http_.port()); }

std::chrono::system_clock::time_point FakeVault::Now() const { return std::chrono::system_clock::now() + offset_; }

void FakeVault::SetRole(const std::string& name, FakeVaultRole role) {
  std::lock_guard lock(mu_);
  roles_[name] = std::move(role);
}

std::string FakeVault::IssueToken(Token t) {
  const auto now = Now();
  t.created = now;
  t.expires = now + std::chrono::seconds(t.ttl_s);
  t.accessor = RandomId(24);
  const std::string token = "hvs." + RandomId(24);
  tokens_[token] = std::move(t);
  return token;
}

std::string FakeVault::CreateToken(std::vector<std::string> read_paths, int64_t ttl_s, int64_t max_ttl_s) {
  std::lock_guard lock(mu_);
  Token t;
  t.read_paths = std::move(read_paths);
  t.ttl_s = ttl_s;
  t.max_expires = Now() + std::chrono::seconds(max_ttl_s);
  return IssueToken(std::move(t));
}

int FakeVault::Put(const std::string& mount, const std::string& path, const std::map<std::string, std::string>& data) {
  std::lock_guard lock(mu_);
  auto& versions = kv_[mount + "/" + path];
  versions.push_back({data, Rfc3339Nano(Now()), "", false});
  return static_cast<int>(versions.size());
}

void FakeVault::SoftDeleteLatest(const std::string& mount, const std::string& path) {
  std::lock_guard lock(mu_);
  auto& versions = kv_[mount + "/" + path];
  if (!versions.empty()) versions.back().deletion_time = Rfc3339Nano(Now());
}

void FakeVault::DestroyLatest(const std::string& mount, const std::string& path) {
  std::lock_guard lock(mu_);
  auto& versions = kv_[mount + "/" + path];
  if (!versions.empty()) {
    versions.back().destroyed = true;
    versions.back().data.clear();
  }
}

void FakeVault::SetSealed(bool sealed) {
  std::lock_guard lock(mu_);
  sealed_ = sealed;
}

void FakeVault::Advance(std::chrono::seconds by) {
  std::lock_guard lock(mu_);
  offset_ += by;
}

void FakeVault::FailNext(int count, int status, const std::string& text) {
  std::lock_guard lock(mu_);
  fail_count_ = count;
  fail_status_ = status;
  fail_text_ = text;
}

void FakeVault::SetDelay(std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  delay_ = delay;
}

void FakeVault::PadAnswer(const std::string& mount, const std::string& path, size_t bytes) {
  std::lock_guard lock(mu_);
  padded_[mount + "/data/" + path] = bytes;
}

size_t FakeVault::PaddingSent() const {
  std::lock_guard lock(mu_);
  return padding_sent_;
}

FakeVault::Token* FakeVault::Live(const std::string& token) {
  auto it = tokens_.find(token);
  if (it == tokens_.end() || it->second.revoked || Now() >= it->second.expires) return nullptr;
  return &it->second;
}

bool FakeVault::TokenValid(const std::string& token) const {
  std::lock_guard lock(mu_);
  return const_cast<FakeVault*>(this)->Live(token) != nullptr;
}

std::vector<FakeVaultRequest> FakeVault::Requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

size_t FakeVault::Count(const std::string& method, const std::string& path_prefix) const {
  std::lock_guard lock(mu_);
  return std::count_if(requests_.begin(), requests_.end(), [&](const FakeVaultRequest& r) {
    return r.method == method && r.path.rfind(path_prefix, 0) == 0;
  });
}

std::vector<std::string> FakeVault::LoginTokens() const {
  std::lock_guard lock(mu_);
  return login_tokens_;
}

json FakeVault::AuthBlock(const std::string& token, const Token& t, const std::vector<std::string>& warnings) {
  const int64_t lease = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::seconds>(t.expires - Now()).count());
  json policies = json::array({"default"});
  if (!t.role.empty()) policies.push_back(t.role);
  return {{"request_id", RandomId(16)},
          {"lease_id", ""},
          {"renewable", false},
          {"lease_duration", 0},
          {"data", nullptr},
          {"wrap_info", nullptr},
          {"warnings", warnings.empty() ? json(nullptr) : json(warnings)},
          {"auth",
           {{"client_token", token},
            {"accessor", t.accessor},
            {"policies", policies},
            {"token_policies", policies},
            {"metadata", t.metadata},
            {"lease_duration", lease},
            {"renewable", true},
            {"entity_id", ""},
            {"token_type", "service"},
            {"orphan", true}}}};
}

void FakeVault::Handle(const HttpRequest& request, HttpResponseWriter& writer) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard lock(mu_);
    delay = delay_;
  }
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  Reply reply = Route(request);
  {
    std::lock_guard lock(mu_);
    requests_.push_back({request.method, request.path, request.Header("x-vault-namespace"),
                         !request.Header("x-vault-token").empty(), reply.status});
  }
  if (reply.padding == 0) {
    writer.Send(reply.status, "application/json", reply.body.is_null() ? "" : reply.body.dump());
    return;
  }
  // The answer with data.data.padding = "xxx...", streamed around a marker.
  reply.body["data"]["data"]["padding"] = "@PADDING@";
  const std::string text = reply.body.dump();
  const size_t at = text.find("@PADDING@");
  if (!writer.BeginStream(reply.status, "application/json") || !writer.WriteChunk(text.substr(0, at))) return;
  const std::string chunk(64 << 10, 'x');
  for (size_t left = reply.padding; left > 0;) {
    const size_t n = std::min(left, chunk.size());
    if (!writer.WriteChunk(chunk.substr(0, n))) return;  // the client hung up
    left -= n;
    std::lock_guard lock(mu_);
    padding_sent_ += n;
  }
  if (writer.WriteChunk(text.substr(at + 9))) writer.EndStream();
}

FakeVault::Reply FakeVault::Route(const HttpRequest& request) {
  {
    std::lock_guard lock(mu_);
    if (fail_count_ > 0) {
      --fail_count_;
      return {fail_status_, Errors({fail_text_})};
    }
    if (sealed_) return {503, Errors({"Vault is sealed"})};
  }
  const std::string& path = request.path;
  const std::string token = request.Header("x-vault-token");
  if (path.rfind("/v1/", 0) != 0) return {404, Errors({})};
  if (request.method == "POST" && path == "/v1/auth/" + auth_mount_ + "/login") return Login(request.body);
  if (request.method == "POST" && path == "/v1/auth/token/renew-self") return Renew(token);
  if (request.method == "GET" && path == "/v1/auth/token/lookup-self") return LookupSelf(token);
  if (request.method == "POST" && path == "/v1/auth/token/revoke-self") {
    std::lock_guard lock(mu_);
    Token* t = Live(token);
    if (!t) return {403, Errors({"permission denied"})};
    t->revoked = true;
    return {204, nullptr};
  }
  if (request.method == "GET") return ReadKv(token, path.substr(4), request.Query("version"));
  return {405, Errors({"unsupported operation"})};
}

FakeVault::Reply FakeVault::Login(const std::string& body) {
  const json request = json::parse(body, nullptr, false);
  if (!request.is_object()) return {400, Errors({"failed to parse JSON input: invalid character"})};
  const std::string role_name = request.value("role", ""), jwt = request.value("jwt", "");
  if (role_name.empty()) return {400, Errors({"missing role"})};
  if (jwt.empty()) return {400, Errors({"missing jwt"})};
  FakeVaultRole role;
  {
    std::lock_guard lock(mu_);
    auto it = roles_.find(role_name);
    if (it == roles_.end()) return {400, Errors({"invalid role name \"" + role_name + "\""})};
    role = it->second;
  }
  // As Vault's kubernetes auth does: the API server says whose token it is.
  json review = {{"apiVersion", "authentication.k8s.io/v1"}, {"kind", "TokenReview"}, {"spec", {{"token", jwt}}}};
  if (!role.audience.empty()) review["spec"]["audiences"] = json::array({role.audience});
  auto [code, text] = PostLoopback(kube_url_, "/apis/authentication.k8s.io/v1/tokenreviews", review.dump());
  const json reviewed = json::parse(text, nullptr, false);
  if (code != 201 || !reviewed.is_object()) return {500, Errors({"lookup failed: could not review the token"})};
  const json status = reviewed.value("status", json::object());
  if (!status.value("authenticated", false)) return {403, Errors({"permission denied"})};
  const std::string username = status["user"].value("username", "");
  // system:serviceaccount:<ns>:<name>
  const std::string prefix = "system:serviceaccount:";
  const size_t colon = username.find(':', prefix.size());
  if (username.rfind(prefix, 0) != 0 || colon == std::string::npos) return {403, Errors({"permission denied"})};
  const std::string ns = username.substr(prefix.size(), colon - prefix.size()), name = username.substr(colon + 1);
  if (!Listed(role.bound_service_account_names, name)) return {403, Errors({"service account name not authorized"})};
  if (!Listed(role.bound_service_account_namespaces, ns)) return {403, Errors({"namespace not authorized"})};
  std::lock_guard lock(mu_);
  Token t;
  t.read_paths = role.read_paths;
  t.role = role_name;
  t.ttl_s = role.token_ttl_s;
  t.max_expires = Now() + std::chrono::seconds(role.token_max_ttl_s);
  t.metadata = {{"role", role_name},
                {"service_account_name", name},
                {"service_account_namespace", ns},
                {"service_account_uid", status["user"].value("uid", "")},
                {"service_account_secret_name", ""}};
  const std::string token = IssueToken(std::move(t));
  login_tokens_.push_back(token);
  return {200, AuthBlock(token, tokens_[token])};
}

FakeVault::Reply FakeVault::Renew(const std::string& token) {
  std::lock_guard lock(mu_);
  Token* t = Live(token);
  if (!t) return {403, Errors({"permission denied"})};
  std::vector<std::string> warnings;
  auto until = Now() + std::chrono::seconds(t->ttl_s);
  if (until > t->max_expires) {
    until = t->max_expires;
    warnings.push_back("TTL of \"" + std::to_string(t->ttl_s) + "s\" exceeded the effective max_ttl; TTL value is capped accordingly");
  }
  t->expires = until;
  return {200, AuthBlock(token, *t, warnings)};
}

FakeVault::Reply FakeVault::LookupSelf(const std::string& token) {
  std::lock_guard lock(mu_);
  Token* t = Live(token);
  if (!t) return {403, Errors({"permission denied"})};
  const int64_t ttl = std::chrono::duration_cast<std::chrono::seconds>(t->expires - Now()).count();
  return {200,
          {{"request_id", RandomId(16)},
           {"data",
            {{"accessor", t->accessor}, {"ttl", ttl}, {"renewable", true}, {"meta", t->metadata},
             {"policies", json::array({"default"})}}}}};
}

FakeVault::Reply FakeVault::ReadKv(const std::string& token, const std::string& api_path, const std::string& version) {
  std::lock_guard lock(mu_);
  Token* t = Live(token);
  if (!t) return {403, Errors({"permission denied"})};
  // As in Vault, a policy changed after login applies to tokens already out.
  const auto role = roles_.find(t->role);
  const auto& patterns = !t->role.empty() && role != roles_.end() ? role->second.read_paths : t->read_paths;
  bool allowed = false;
  for (const auto& pattern : patterns) allowed = allowed || PathMatches(pattern, api_path);
  if (!allowed) return {403, Errors({kPolicyDenied})};
  // <mount>/data/<path>
  const size_t data = api_path.find("/data/");
  if (data == std::string::npos) return {404, Errors({})};
  auto it = kv_.find(api_path.substr(0, data) + "/" + api_path.substr(data + 6));
  if (it == kv_.end() || it->second.empty()) return {404, Errors({})};
  size_t index = it->second.size();
  if (!version.empty() && version != "0") {
    try {
      index = std::stoul(version);
    } catch (...) {
      return {400, Errors({"invalid version"})};
    }
    if (index < 1 || index > it->second.size()) return {404, Errors({})};
  }
  const Version& v = it->second[index - 1];
  json metadata = {{"created_time", v.created_time},
                   {"custom_metadata", nullptr},
                   {"deletion_time", v.deletion_time},
                   {"destroyed", v.destroyed},
                   {"version", index}};
  json body = {{"request_id", RandomId(16)}, {"lease_id", ""},       {"renewable", false}, {"lease_duration", 0},
               {"wrap_info", nullptr},       {"warnings", nullptr}, {"auth", nullptr}};
  if (!v.deletion_time.empty() || v.destroyed) {
    body["data"] = {{"data", nullptr}, {"metadata", metadata}};
    return {404, body};
  }
  body["data"] = {{"data", v.data}, {"metadata", metadata}};
  const auto pad = padded_.find(api_path);
  return {200, body, pad == padded_.end() ? 0 : pad->second};
}

}  // namespace moeserve::fakes

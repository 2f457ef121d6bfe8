#include "moeserve/storage/sigv4.hpp"

#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>

#include "moeserve/common/sha256.hpp"

namespace moeserve::storage {
namespace {

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[32];
  unsigned int len = sizeof(out);
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string Hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Canonical header value: trimmed, inner runs of spaces collapsed to one.
std::string TrimValue(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

// Lowercase name -> comma-joined values, sorted by name.
std::map<std::string, std::string> CanonicalHeaderMap(const KeyValues& headers) {
  std::map<std::string, std::string> m;
  for (const auto& [name, value] : headers) {
    std::string key = Lower(name);
    auto it = m.find(key);
    if (it == m.end()) m.emplace(key, TrimValue(value));
    else it->second += "," + TrimValue(value);
  }
  return m;
}

std::string SignedHeaders(const std::map<std::string, std::string>& m) {
  std::string s;
  for (const auto& [name, value] : m) {
    if (!s.empty()) s += ';';
    s += name;
  }
  return s;
}

}  // namespace

std::string AwsUriEncode(std::string_view s, bool encode_slash) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (c == '/' && !encode_slash)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

std::string AmzDate(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string CanonicalRequest(const SigV4Request& r) {
  std::vector<std::pair<std::string, std::string>> q;
  for (const auto& [k, v] : r.query) q.emplace_back(AwsUriEncode(k, true), AwsUriEncode(v, true));
  std::sort(q.begin(), q.end());
  std::string query;
  for (const auto& [k, v] : q) {
    if (!query.empty()) query += '&';
    query += k + "=" + v;
  }
  auto headers = CanonicalHeaderMap(r.headers);
  std::string canonical_headers;
  for (const auto& [name, value] : headers) canonical_headers += name + ":" + value + "\n";
  return r.method + "\n" + (r.canonical_uri.empty() ? "/" : r.canonical_uri) + "\n" + query + "\n" +
         canonical_headers + "\n" + SignedHeaders(headers) + "\n" + r.payload_sha256;
}

static std::string Scope(const SigV4Scope& scope, std::string_view amz_date) {
  return std::string(amz_date.substr(0, 8)) + "/" + scope.region + "/" + scope.service + "/aws4_request";
}

std::string StringToSign(const SigV4Request& request, const SigV4Scope& scope, std::string_view amz_date) {
  return "AWS4-HMAC-SHA256\n" + std::string(amz_date) + "\n" + Scope(scope, amz_date) + "\n" +
         Sha256Hex(CanonicalRequest(request));
}

std::string AuthorizationHeader(const SigV4Request& request, const AwsCredentials& credentials,
                                const SigV4Scope& scope, std::string_view amz_date) {
  std::string k_date = HmacSha256("AWS4" + credentials.secret_access_key, amz_date.substr(0, 8));
  std::string k_region = HmacSha256(k_date, scope.region);
  std::string k_service = HmacSha256(k_region, scope.service);
  std::string k_signing = HmacSha256(k_service, "aws4_request");
  std::string signature = Hex(HmacSha256(k_signing, StringToSign(request, scope, amz_date)));
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + Scope(scope, amz_date) +
         ", SignedHeaders=" + SignedHeaders(CanonicalHeaderMap(request.headers)) + ", Signature=" + signature;
}

static std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

static std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

Result<AwsCredentials> LoadAwsCredentials(const std::string& credentials_file) {
  AwsCredentials c;
  c.access_key_id = Env("AWS_ACCESS_KEY_ID");
  c.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  if (!c.access_key_id.empty() && credentials_file.empty()) {
    if (c.secret_access_key.empty())
      return Fail(Error::InvalidArgument("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"));
    return c;
  }
  std::string path = credentials_file;
  bool explicit_file = !path.empty();
  if (path.empty()) path = Env("AWS_SHARED_CREDENTIALS_FILE");
  explicit_file = explicit_file || !path.empty();
  if (path.empty() && !Env("HOME").empty()) path = Env("HOME") + "/.aws/credentials";
  std::ifstream in(path);
  if (!in) {
    if (explicit_file) return Fail(Error::NotFound("AWS credentials file '" + path + "': cannot open"));
    return AwsCredentials{};
  }
  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  AwsCredentials f;
  std::string line, section;
  bool found_profile = false;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      if (section.rfind("profile ", 0) == 0) section = Trim(section.substr(8));
      found_profile = found_profile || section == profile;
      continue;
    }
    if (section != profile) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = Lower(Trim(line.substr(0, eq))), v = Trim(line.substr(eq + 1));
    if (k == "aws_access_key_id") f.access_key_id = v;
    else if (k == "aws_secret_access_key") f.secret_access_key = v;
    else if (k == "aws_session_token") f.session_token = v;
  }
  if (!found_profile) {
    if (explicit_file) return Fail(Error::NotFound("AWS credentials file '" + path + "': no profile [" + profile + "]"));
    return AwsCredentials{};
  }
  if (f.access_key_id.empty() || f.secret_access_key.empty())
    return Fail(Error::InvalidArgument("AWS credentials file '" + path + "', profile [" + profile +
                                       "]: needs aws_access_key_id and aws_secret_access_key"));
  return f;
}

}  // namespace moeserve::storage

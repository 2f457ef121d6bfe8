// The SigV4 signer against published AWS test-suite values and against
// botocore (a real signer) with a frozen clock, for the requests the puller
// sends: GET, ranged GET, HEAD, ListObjectsV2; with and without session
// tokens; keys with spaces, unicode and reserved characters.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/s3_request.hpp"
#include "moeserve/storage/sigv4.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

// docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite.html: these
// credentials, this instant, service "service" in us-east-1.
constexpr const char* kSuiteDate = "20150830T123600Z";
const AwsCredentials kSuiteCredentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
const SigV4Scope kSuiteScope{"us-east-1", "service"};
constexpr const char* kSuitePrefix =
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, ";

SigV4Request SuiteRequest(std::string method, std::string path, KeyValues query = {}, KeyValues extra = {}) {
  SigV4Request r;
  r.method = std::move(method);
  r.canonical_uri = std::move(path);
  r.query = std::move(query);
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", kSuiteDate}};
  for (auto& h : extra) r.headers.push_back(h);
  r.payload_sha256 = Sha256Hex(std::string_view(""));
  return r;
}

std::string SuiteSign(const SigV4Request& r) { return AuthorizationHeader(r, kSuiteCredentials, kSuiteScope, kSuiteDate); }

TEST(SigV4Suite, GetVanilla) {
  EXPECT_EQ(SuiteSign(SuiteRequest("GET", "/")),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;x-amz-date, "
                "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(SigV4Suite, GetVanillaQueryOrderKeyCase) {
  // Sent as ?Param2=value2&Param1=value1: signing sorts the parameters.
  EXPECT_EQ(SuiteSign(SuiteRequest("GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}})),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;x-amz-date, "
                "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST(SigV4Suite, PostVanilla) {
  EXPECT_EQ(SuiteSign(SuiteRequest("POST", "/")),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;x-amz-date, "
                "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

TEST(SigV4Suite, GetUtf8) {
  // The path "/\u1234" as sent on the wire.
  EXPECT_EQ(AwsUriEncode("/\xE1\x88\xB4", false), "/%E1%88%B4");
  EXPECT_EQ(SuiteSign(SuiteRequest("GET", "/%E1%88%B4")),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;x-amz-date, "
                "Signature=8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
}

TEST(SigV4Suite, GetHeaderKeyDuplicate) {
  // My-Header1 sent three times: values join with commas in their order.
  EXPECT_EQ(SuiteSign(SuiteRequest("GET", "/", {},
                                   {{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}})),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;my-header1;x-amz-date, "
                "Signature=c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea");
}

TEST(SigV4Suite, GetHeaderValueMultiline) {
  EXPECT_EQ(SuiteSign(SuiteRequest("GET", "/", {}, {{"My-Header1", "value1,value2,value3"}})),
            std::string(kSuitePrefix) +
                "SignedHeaders=host;my-header1;x-amz-date, "
                "Signature=ba17b383a53190154eb5fa66a1b836cc297cc0a3d70a5d00705980573d8ff790");
}

TEST(SigV4Suite, CanonicalRequestShape) {
  EXPECT_EQ(CanonicalRequest(SuiteRequest("GET", "/")),
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // Values are trimmed and inner runs of spaces collapse.
  SigV4Request r = SuiteRequest("GET", "/", {}, {{"My-Header1", "  a   b  c "}});
  EXPECT_NE(CanonicalRequest(r).find("my-header1:a b c\n"), std::string::npos);
  EXPECT_EQ(AmzDate(std::chrono::system_clock::time_point(std::chrono::seconds(1440938160))), kSuiteDate);
}

// One request for both signers.
struct Case {
  std::string name;
  std::string method;
  S3Endpoint endpoint;
  AwsCredentials credentials;
  std::string bucket, key;
  KeyValues query;
  KeyValues extra;
};

std::string UrlWithoutQuery(const std::string& url) { return url.substr(0, url.find('?')); }

TEST(SigV4Botocore, AuthorizationHeadersMatch) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 not installed";
  const auto now = std::chrono::system_clock::time_point(std::chrono::seconds(1714564800));  // 2024-05-01T12:00:00Z
  S3Endpoint aws{"https", "s3.eu-west-1.amazonaws.com", "eu-west-1", false};
  S3Endpoint local{"http", "127.0.0.1:9000", "us-east-1", true};
  AwsCredentials plain{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  AwsCredentials session{"ASIAEXAMPLETEMP", "secret/with+slash=", "FwoGZXIvYXdzEJr//////////wEaDN+token=="};
  std::vector<Case> cases = {
      {"get virtual-host", "GET", aws, plain, "models", "tiny/v1/model-00001.safetensors", {}, {}},
      {"ranged get", "GET", aws, plain, "models", "tiny/v1/model-00001.safetensors", {}, {{"range", "bytes=1048576-2097151"}}},
      {"head path-style", "HEAD", local, plain, "models", "tiny/v1/config.json", {}, {}},
      {"list objects v2", "GET", local, plain, "models", "",
       {{"list-type", "2"}, {"prefix", "tiny/v1/"}, {"continuation-token", "1/abc+def=="}}, {}},
      {"session token", "GET", aws, session, "models", "tiny/v1/manifest.json", {}, {{"range", "bytes=0-99"}}},
      {"session token list", "GET", local, session, "models", "", {{"list-type", "2"}, {"prefix", "a b/c"}}, {}},
      {"special characters", "GET", local, plain, "models", "odd dir/ä ö+ü=&;,$@!'()*~._-/shard #1?.bin", {}, {}},
      {"unicode virtual-host", "HEAD", aws, session, "my.bucket-1", "日本/モデル.json", {}, {}},
  };
  nlohmann::json requests = nlohmann::json::array();
  std::vector<std::string> ours;
  for (const auto& c : cases) {
    HttpRequestSpec spec = BuildS3Request(c.endpoint, c.credentials, c.method, c.bucket, c.key, c.query, c.extra, now);
    nlohmann::json headers = nlohmann::json::object();
    std::string authorization;
    for (const auto& [k, v] : spec.headers) {
      if (k == "Authorization") authorization = v;
      else if (k == "range") headers[k] = v;  // botocore adds its own date, hash and token headers
    }
    ours.push_back(authorization);
    nlohmann::json params = nlohmann::json::array();
    for (const auto& [k, v] : c.query) params.push_back({k, v});
    requests.push_back({{"method", c.method},
                        {"url", UrlWithoutQuery(spec.url)},
                        {"params", params},
                        {"headers", headers},
                        {"access_key", c.credentials.access_key_id},
                        {"secret_key", c.credentials.secret_access_key},
                        {"token", c.credentials.session_token},
                        {"region", c.endpoint.region},
                        {"time", AmzDate(now)}});
  }
  std::string dir = testing::MakeTempDir("sigv4");
  std::ofstream(dir + "/in.json") << requests.dump();
  std::string script = testing::SourceDir() + "/tests/storage/botocore_sign.py";
  std::string cmd = "/usr/bin/python3 " + script + " < " + dir + "/in.json > " + dir + "/out.json";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::filesystem::remove_all(dir);
    if (std::system("/usr/bin/python3 -c 'import botocore' 2>/dev/null") != 0)
      GTEST_SKIP() << "python3-botocore is not installed";
    FAIL() << "botocore_sign.py failed: " << cmd;
  }
  std::ifstream in(dir + "/out.json");
  nlohmann::json theirs = nlohmann::json::parse(in);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(theirs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(ours[i], theirs[i]["authorization"].get<std::string>()) << cases[i].name;
    EXPECT_EQ(theirs[i]["x-amz-date"], "20240501T120000Z");
  }
}

TEST(S3Request, AddressingStyles) {
  auto now = std::chrono::system_clock::now();
  AwsCredentials none;
  auto aws = MakeS3Endpoint("", "eu-west-1", S3AddressingStyle::kAuto);
  ASSERT_TRUE(aws);
  EXPECT_EQ(BuildS3Request(*aws, none, "GET", "b", "k/x y", {}, {}, now).url,
            "https://b.s3.eu-west-1.amazonaws.com/k/x%20y");
  auto custom = MakeS3Endpoint("http://127.0.0.1:9000/", "", S3AddressingStyle::kAuto);
  ASSERT_TRUE(custom);
  EXPECT_TRUE(custom->path_style);
  EXPECT_EQ(BuildS3Request(*custom, none, "GET", "b", "k", {}, {}, now).url, "http://127.0.0.1:9000/b/k");
  auto vhost = MakeS3Endpoint("https://minio.local:443", "r1", S3AddressingStyle::kVirtualHost);
  ASSERT_TRUE(vhost);
  EXPECT_EQ(vhost->host, "minio.local");
  EXPECT_EQ(BuildS3Request(*vhost, none, "GET", "b", "k", {{"list-type", "2"}}, {}, now).url,
            "https://b.minio.local/k?list-type=2");
  EXPECT_FALSE(MakeS3Endpoint("ftp://x", "", S3AddressingStyle::kAuto));
  // Anonymous requests carry no Authorization.
  for (const auto& [k, v] : BuildS3Request(*custom, none, "GET", "b", "k", {}, {}, now).headers)
    EXPECT_NE(k, "Authorization");
}

TEST(Credentials, EnvironmentThenFile) {
  std::string dir = testing::MakeTempDir("creds");
  std::ofstream(dir + "/credentials") << "[default]\naws_access_key_id = AKFILE\naws_secret_access_key = SFILE\n\n"
                                      << "[profile other]\naws_access_key_id=AKOTHER\naws_secret_access_key=SOTHER\n"
                                      << "aws_session_token=TOK\n";
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SESSION_TOKEN");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (dir + "/credentials").c_str(), 1);
  ::unsetenv("AWS_PROFILE");
  auto c = LoadAwsCredentials();
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->access_key_id, "AKFILE");
  ::setenv("AWS_PROFILE", "other", 1);
  c = LoadAwsCredentials();
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->access_key_id, "AKOTHER");
  EXPECT_EQ(c->session_token, "TOK");
  ::setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "SENV", 1);
  c = LoadAwsCredentials();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->access_key_id, "AKENV");
  // A mounted file named explicitly wins over the environment.
  ::unsetenv("AWS_PROFILE");
  c = LoadAwsCredentials(dir + "/credentials");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->access_key_id, "AKFILE");
  EXPECT_FALSE(LoadAwsCredentials(dir + "/missing"));
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::storage

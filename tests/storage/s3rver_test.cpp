// The puller against s3rver, a real S3 protocol server: SigV4-signed GETs and
// ListObjectsV2, path and virtual-host style, the
// generated tiny model pulled, verified and loaded; clear errors for unknown
// access keys and missing objects; 429 and 403 through a faulting proxy.
#include <gtest/gtest.h>

#include <filesystem>

#include "moeserve/storage/weight_puller.hpp"
#include "moeserve/engine/model_dir.hpp"
#include "s3rver.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::FaultPlan;
using testing::FaultProxy;
using testing::MakeTempDir;
using testing::S3rver;

class S3rverTest : public ::testing::Test {
 protected:
  // s3rver 3.7 checks the access key of a V4 signature but not the signature
  // itself ("Signature version 4 calculation is unimplemented"); the signer's
  // correctness is storage_sigv4's job (botocore and the AWS test suite).
  static void SetUpTestSuite() {
    server_ = S3rver::Start("models", &why_).release();
    if (!server_) return;
    std::string rand = MakeTempDir("s3-rand");
    testing::WriteRandomModel(rand, {{"a.bin", 700000}, {"dir/b c.bin", 200000}, {"config.json", 300}});
    ASSERT_TRUE(server_->UploadDir("models", "rand/v1/", rand));
    fs::remove(rand + "/manifest.json");
    ASSERT_TRUE(server_->UploadDir("models", "nomanifest/", rand));
    fs::remove_all(rand);
    std::string gen = testing::BinaryDir() + "/engine/moe-model-gen";
    if (fs::exists(gen)) {
      tiny_ = MakeTempDir("s3-tiny");
      fs::remove(tiny_);  // the generator wants to create the folder itself
      std::string cmd = gen + " --preset tiny --seed 1 --out " + tiny_ + " > /dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0);
      ASSERT_TRUE(server_->UploadDir("models", "tiny/v1/", tiny_));
    }
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    if (!tiny_.empty()) fs::remove_all(tiny_);
  }
  void SetUp() override {
    if (!server_) GTEST_SKIP() << why_;
    cache_ = MakeTempDir("s3-cache");
    options_.revision = "v1";
    options_.part_size = 256 << 10;
    options_.connections = 4;
    options_.log_progress = false;
    options_.retry.base_delay = std::chrono::milliseconds(20);
    options_.source.endpoint_url = server_->endpoint();
    options_.source.credentials = AwsCredentials{S3rver::kAccessKey, S3rver::kSecretKey, ""};
  }
  void TearDown() override {
    if (!cache_.empty()) fs::remove_all(cache_);
  }
  static S3rver* server_;
  static std::string why_;
  static std::string tiny_;
  std::string cache_;
  PullOptions options_;
};
S3rver* S3rverTest::server_ = nullptr;
std::string S3rverTest::why_;
std::string S3rverTest::tiny_;

TEST_F(S3rverTest, PullsTheGeneratedModelThenLoadsIt) {
  if (tiny_.empty()) GTEST_SKIP() << "moe-model-gen is not built";
  // Credentials the standard way: the AWS_* environment variables.
  options_.source.credentials.reset();
  ::setenv("AWS_ACCESS_KEY_ID", S3rver::kAccessKey, 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", S3rver::kSecretKey, 1);
  WeightPuller puller({cache_});
  PullStatus status;
  auto pulled = puller.Pull("s3://models/tiny/v1/", options_, &status);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(status.Snapshot().state, PullState::kReady);
  auto model = engine::OpenModelDir(pulled->dir, {.verify_manifest = true});
  ASSERT_TRUE(model) << model.error().ToString();
  EXPECT_EQ(model->config.num_layers, 6);
}

TEST_F(S3rverTest, VirtualHostStyle) {
  options_.source.endpoint_url = "http://s3.localhost:" + std::to_string(server_->port());
  options_.source.addressing = S3AddressingStyle::kVirtualHost;
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/rand/v1", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(fs::file_size(pulled->dir + "/dir/b c.bin"), 200000u);
}

TEST_F(S3rverTest, NoVerifyListsTheBucket) {
  WeightPuller puller({cache_});
  auto refused = puller.Pull("s3://models/nomanifest/", options_);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(refused.error().message().find("--no-verify"), std::string::npos) << refused.error().message();
  options_.verify = false;
  auto pulled = puller.Pull("s3://models/nomanifest/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(fs::file_size(pulled->dir + "/a.bin"), 700000u);
  EXPECT_EQ(fs::file_size(pulled->dir + "/dir/b c.bin"), 200000u);
}

TEST_F(S3rverTest, UnknownAccessKeyFailsAtOnceWithTheServersWords) {
  options_.source.credentials = AwsCredentials{"NOSUCHKEY", "whatever", ""};
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/rand/v1/", options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kPermissionDenied);
  const std::string& m = pulled.error().message();
  EXPECT_NE(m.find("InvalidAccessKeyId"), std::string::npos) << m;
  EXPECT_NE(m.find("bucket 'models'"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'rand/v1/manifest.json'"), std::string::npos) << m;
  EXPECT_NE(m.find("403"), std::string::npos) << m;
}

TEST_F(S3rverTest, MissingObjectNamesBucketAndKey) {
  // A manifest listing a shard that was never uploaded.
  std::string dir = MakeTempDir("s3-missing");
  testing::WriteRandomModel(dir, {{"present.bin", 1000}, {"absent.bin", 2000}});
  fs::remove(dir + "/absent.bin");
  ASSERT_TRUE(server_->UploadDir("models", "broken/", dir));
  fs::remove_all(dir);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/broken/", options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kNotFound);
  const std::string& m = pulled.error().message();
  EXPECT_NE(m.find("bucket 'models', key 'broken/absent.bin'"), std::string::npos) << m;
  EXPECT_NE(m.find("NoSuchKey"), std::string::npos) << m;
}

TEST_F(S3rverTest, TooManyRequestsHonoursRetryAfterThenSucceeds) {
  FaultPlan plan;
  std::string body = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
  plan.canned_response = "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Type: application/xml\r\n"
                         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  plan.faulty_connections = 2;
  FaultProxy proxy(server_->port(), plan);
  options_.source.endpoint_url = proxy.url();
  // Without Retry-After the backoff would be ~20 ms; the policy must wait the server's second.
  options_.retry.max_attempts = 3;
  WeightPuller puller({cache_});
  auto started = std::chrono::steady_clock::now();
  auto pulled = puller.Pull("s3://models/rand/v1/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(proxy.faults(), 2);
  // Not a speed assert: a lower bound that only holds if Retry-After was honoured.
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(1900));
}

TEST_F(S3rverTest, ConnectionsCutMidBodyResumeWithRanges) {
  FaultPlan plan;
  plan.cut_after_bytes = 90 << 10;
  FaultProxy proxy(server_->port(), plan);
  options_.source.endpoint_url = proxy.url();
  options_.retry.base_delay = std::chrono::milliseconds(5);
  options_.retry.max_delay = std::chrono::milliseconds(50);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/rand/v1/", options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_GT(proxy.faults(), 5);
  // s3rver's response headers are larger than a file server's; allow them on top of the body.
  EXPECT_LT(static_cast<double>(proxy.bytes_to_client()), 1.1 * static_cast<double>(pulled->stats.bytes_fetched));
  EXPECT_EQ(fs::file_size(pulled->dir + "/a.bin"), 700000u);
}

TEST_F(S3rverTest, ForbiddenFailsAtOnce) {
  FaultPlan plan;
  std::string body = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
  plan.canned_response = "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  FaultProxy proxy(server_->port(), plan);
  options_.source.endpoint_url = proxy.url();
  WeightPuller puller({cache_});
  auto pulled = puller.Pull("s3://models/rand/v1/", options_);
  ASSERT_FALSE(pulled);
  EXPECT_EQ(pulled.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(proxy.faults(), 1) << "403 is final: no retries";
  EXPECT_NE(pulled.error().message().find("AccessDenied: Access Denied"), std::string::npos) << pulled.error().message();
  EXPECT_NE(pulled.error().message().find("bucket 'models'"), std::string::npos) << pulled.error().message();
}

TEST(S3rverTls, HttpsWithAPrivateCa) {
  std::string dir = MakeTempDir("s3-tls");
  std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
                    "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " + dir + "/key.pem -out " + dir +
                    "/cert.pem > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl CLI not available";
  std::string why;
  auto server = S3rver::Start("models", &why, dir + "/cert.pem", dir + "/key.pem");
  if (!server) GTEST_SKIP() << why;
  std::string model = dir + "/model";
  testing::WriteRandomModel(model, {{"w.bin", 300000}});
  ASSERT_TRUE(server->UploadDir("models", "tls/", model));
  PullOptions options;
  options.revision = "v1";
  options.log_progress = false;
  options.source.endpoint_url = server->endpoint();
  options.source.credentials = AwsCredentials{S3rver::kAccessKey, S3rver::kSecretKey, ""};
  WeightPuller puller({dir + "/cache"});
  // Untrusted certificate: a clear, final error.
  options.retry.max_attempts = 2;
  auto untrusted = puller.Pull("s3://models/tls/", options);
  ASSERT_FALSE(untrusted);
  EXPECT_NE(untrusted.error().message().find("https://127.0.0.1"), std::string::npos) << untrusted.error().message();
  options.source.ca_file = dir + "/cert.pem";
  auto pulled = puller.Pull("s3://models/tls/", options);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_EQ(fs::file_size(pulled->dir + "/w.bin"), 300000u);
  server.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::storage

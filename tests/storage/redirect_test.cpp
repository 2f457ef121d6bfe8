// Redirects of an https source against a real TLS peer (openssl s_server):
// one to http is refused with a clear, final error before anything is asked
// of the http server; one to another https location is still followed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moeserve/storage/weight_puller.hpp"
#include "openssl_server.hpp"
#include "test_servers.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;
using testing::MakeTempDir;
using testing::OpenSslHttpServer;
using testing::RangeFileServer;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class RedirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    tls_ = OpenSslHttpServer::Start(&why);
    if (!tls_) GTEST_SKIP() << why;
    src_ = MakeTempDir("redirect-src");
    cache_ = MakeTempDir("redirect-cache");
    testing::WriteRandomModel(src_, {{"a.bin", 50000}, {"config.json", 300}});
    options_.revision = "r";
    options_.log_progress = false;
    options_.connections = 2;
    options_.retry.base_delay = std::chrono::milliseconds(5);
    options_.retry.max_attempts = 3;
    options_.source.ca_file = tls_->ca_file();
  }
  void TearDown() override {
    tls_.reset();
    if (!src_.empty()) fs::remove_all(src_);
    if (!cache_.empty()) fs::remove_all(cache_);
  }
  std::unique_ptr<OpenSslHttpServer> tls_;
  std::string src_, cache_;
  PullOptions options_;
};

TEST_F(RedirectTest, HttpsToHttpIsRefused) {
  RangeFileServer plain(src_);
  for (const char* name : {"manifest.json", "a.bin", "config.json"}) tls_->Redirect(name, plain.url() + name);
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(tls_->url(), options_);
  ASSERT_FALSE(pulled) << "pulled over http into " << pulled->dir;
  const std::string& m = pulled.error().message();
  EXPECT_EQ(pulled.error().code(), ErrorCode::kPermissionDenied) << pulled.error().ToString();
  EXPECT_NE(m.find("redirect"), std::string::npos) << m;
  EXPECT_NE(m.find(plain.url() + "manifest.json"), std::string::npos) << "names where it was sent: " << m;
  EXPECT_NE(m.find("https"), std::string::npos) << m;
  EXPECT_EQ(plain.requests(), 0) << "not one request went out in clear text";
  EXPECT_FALSE(fs::exists(cache_ + "/models") && !fs::is_empty(cache_ + "/models"));
}

TEST_F(RedirectTest, HttpsToHttpsIsFollowed) {
  std::string why;
  auto target = OpenSslHttpServer::Start(&why);
  ASSERT_TRUE(target) << why;
  for (const char* name : {"manifest.json", "a.bin", "config.json"}) {
    tls_->Redirect(name, target->url() + name);
    target->Serve(name, ReadAll(src_ + "/" + name));
  }
  // Both peers use their own self-signed certificate: trust both.
  std::string bundle = cache_ + "-ca.pem";
  std::ofstream(bundle) << ReadAll(tls_->ca_file()) << ReadAll(target->ca_file());
  options_.source.ca_file = bundle;
  WeightPuller puller({cache_});
  auto pulled = puller.Pull(tls_->url(), options_);
  ASSERT_TRUE(pulled) << pulled.error().ToString();
  EXPECT_TRUE(ReadAll(pulled->dir + "/a.bin") == ReadAll(src_ + "/a.bin"));
  fs::remove(bundle);
}

}  // namespace
}  // namespace moeserve::storage

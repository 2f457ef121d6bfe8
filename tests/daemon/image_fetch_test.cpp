// daemon.image_fetch: http(s) image URLs fetched from a real local HTTP
// server under the hooks' address policy: loopback (by address and by a name
// that resolves to it) is refused unless image_url_allow_private_addresses;
// a host outside image_url_allowed_hosts, an answer over image_max_bytes, a
// redirect and a server slower than image_fetch_timeout_seconds are each
// refused with the setting named; an allowed fetch returns the exact bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/daemon/image/image_decode.hpp"
#include "../support/test_images.hpp"

namespace moeserve::daemon {
namespace {

using Answer = HttpResponse;

// A real HTTP server answering every request with `answer()`, counting them.
class ImageServer {
 public:
  explicit ImageServer(std::function<Answer()> answer) : answer_(std::move(answer)) {
    HttpServerOptions o;
    o.port = 0;
    o.threads = 1;
    HttpServerHooks hooks;
    hooks.admit = [](const HttpHead&) { return HttpAdmission::Accept(1 << 20); };
    hooks.handle = [this](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) {
      {
        std::lock_guard lock(mu_);
        ++requests_;
      }
      ex->Reply(answer_());
    };
    auto s = HttpServer::Start(o, std::move(hooks));
    if (!s) ADD_FAILURE() << s.error().ToString();
    else server_ = std::move(*s);
  }
  ~ImageServer() {
    if (server_) server_->Stop();
  }
  std::string Url(const std::string& host = "127.0.0.1") const {
    return "http://" + host + ":" + std::to_string(server_ ? server_->port() : 0) + "/shot.png?token=secret";
  }
  int requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  std::function<Answer()> answer_;
  std::mutex mu_;
  int requests_ = 0;
  std::unique_ptr<HttpServer> server_;
};

std::string Png() { return test_support::EncodePng(4, 3, test_support::Gradient(4, 3)); }

ImageUrlPolicy LoopbackPolicy(bool allow_private) {
  ImageUrlPolicy p;
  p.allowed_hosts = {"127.0.0.1", "localhost"};
  p.allow_private_addresses = allow_private;
  return p;
}

TEST(ImageFetch, LoopbackIsRefusedUnlessPrivateAddressesAreAllowed) {
  const std::string png = Png();
  ImageServer server([&] { return Answer{200, "image/png", {}, png}; });
  for (const char* host : {"127.0.0.1", "localhost"}) {
    auto got = FetchImageUrl(server.Url(host), LoopbackPolicy(false), 2);
    ASSERT_FALSE(got.has_value()) << host;
    EXPECT_TRUE(got.error().message().starts_with("image 2 (")) << got.error().message();
    EXPECT_NE(got.error().message().find("image_url_allow_private_addresses"), std::string::npos)
        << got.error().message();
    EXPECT_EQ(got.error().message().find("token=secret"), std::string::npos) << "the query is not for messages";
  }
  EXPECT_EQ(server.requests(), 0);
  auto got = FetchImageUrl(server.Url(), LoopbackPolicy(true), 0);
  ASSERT_TRUE(got.has_value()) << got.error().message();
  EXPECT_EQ(*got, png);
  EXPECT_EQ(server.requests(), 1);
  auto img = DecodeImage(*got, ImageLimits{}, 0);
  ASSERT_TRUE(img.has_value()) << img.error().message();
  EXPECT_EQ(img->width, 4u);
}

TEST(ImageFetch, MetadataAddressIsRefusedEvenWhenListed) {
  ImageUrlPolicy p;
  p.allowed_hosts = {"169.254.169.254"};
  auto got = FetchImageUrl("http://169.254.169.254/latest/meta-data/", p, 0);
  ASSERT_FALSE(got.has_value());
  EXPECT_NE(got.error().message().find("image_url_allow_private_addresses"), std::string::npos)
      << got.error().message();
}

TEST(ImageFetch, HostMustBeListedAsLibcurlParsesIt) {
  ImageServer server([] { return Answer{200, "image/png", {}, Png()}; });
  ImageUrlPolicy p = LoopbackPolicy(true);
  p.allowed_hosts = {"localhost"};
  auto got = FetchImageUrl(server.Url("127.0.0.1"), p, 1);
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.error().message(), "image 1: host '127.0.0.1' is not in image_url_allowed_hosts");
  EXPECT_EQ(server.requests(), 0);
}

TEST(ImageFetch, AnswerOverTheByteLimitIsRefused) {
  ImageServer server([] { return Answer{200, "image/png", {}, std::string(5000, 'x')}; });
  ImageUrlPolicy p = LoopbackPolicy(true);
  p.limits.max_bytes = 4096;
  auto got = FetchImageUrl(server.Url(), p, 0);
  ASSERT_FALSE(got.has_value());
  EXPECT_NE(got.error().message().find("over the limit of 4096 bytes (image_max_bytes)"), std::string::npos)
      << got.error().message();
}

TEST(ImageFetch, RedirectsAreNotFollowed) {
  ImageServer target([] { return Answer{200, "image/png", {}, Png()}; });
  ImageServer redirect([&] { return Answer{302, "text/plain", {{"Location", target.Url()}}, ""}; });
  auto got = FetchImageUrl(redirect.Url(), LoopbackPolicy(true), 0);
  ASSERT_FALSE(got.has_value());
  EXPECT_NE(got.error().message().find("HTTP 302 (redirects are not followed)"), std::string::npos)
      << got.error().message();
  EXPECT_EQ(target.requests(), 0);
}

TEST(ImageFetch, ASlowServerRunsIntoTheTimeout) {
  ImageServer server([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return Answer{200, "image/png", {}, Png()};
  });
  ImageUrlPolicy p = LoopbackPolicy(true);
  p.fetch_timeout_seconds = 0.2;
  auto got = FetchImageUrl(server.Url(), p, 0);
  ASSERT_FALSE(got.has_value());
  EXPECT_NE(got.error().message().find("(image_fetch_timeout_seconds)"), std::string::npos) << got.error().message();
}

}  // namespace
}  // namespace moeserve::daemon

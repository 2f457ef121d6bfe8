// Shared helpers for the daemon tests that serve images: a tiny generated
// model with a vision tower, PNG data URLs, Responses input with an image,
// and what the state volume's sessions database keeps of images, read from
// the real file beside the daemon.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../support/test_images.hpp"
#include "daemon_harness.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/http/http_server.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon::testing {

inline const std::string& VisionModelDir() {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "/moe_image_serving_model_" + std::to_string(::getpid());
    std::filesystem::remove_all(d);
    engine::ModelGenOptions o;
    o.config = *engine::PresetConfig("tiny");
    o.config.vision = engine::TinyVisionConfig();
    o.seed = 7;
    auto st = engine::GenerateModel(o, d);
    if (!st) ADD_FAILURE() << st.error().ToString();
    return d;
  }();
  return dir;
}

// Pixels that do not compress: the file's size is about w * h * 3 bytes.
inline std::string NoisyPng(uint32_t w, uint32_t h, uint32_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : rgb) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<uint8_t>(x);
  }
  return test_support::EncodePng(w, h, rgb);
}

inline std::string PngDataUrl(const std::string& png) { return "data:image/png;base64," + Base64Encode(png); }

// A Responses API input of one user message with a text and an image part.
inline json ImageInput(const std::string& url, const std::string& text = "Read this") {
  return json::array({{{"role", "user"},
                       {"content", json::array({{{"type", "input_text"}, {"text", text}},
                                                {{"type", "input_image"}, {"image_url", url}, {"detail", "auto"}}})}}});
}

// One number from the database file (opened read-only, as another process would).
inline int64_t DatabaseNumber(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  int64_t out = -1;
  if (sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
      out = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
  EXPECT_GE(out, 0) << "could not read " << db_path << ": " << sql;
  return out;
}

// Bytes of image files the database holds, for one tenant or ("") every one.
inline int64_t StoredImageBytes(const std::string& db_path, const std::string& tenant = "") {
  return DatabaseNumber(db_path, "SELECT coalesce(sum(length(data)), 0) FROM images" +
                                     (tenant.empty() ? std::string() : " WHERE tenant = '" + tenant + "'"));
}

// A real HTTP server standing in for an allowed image host (127.0.0.1): it
// counts the requests it gets and answers each with `png`, at once or,
// trickling, one byte every 100 ms until the client hangs up (a fetch that
// never completes). open() counts the trickled answers still going: fetches
// the daemon has not given up on.
class ImageHost {
 public:
  ImageHost(std::string png, bool trickle) : png_(std::move(png)), trickle_(trickle) {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    HttpServerHooks hooks;
    hooks.admit = [](const HttpHead&) { return HttpAdmission::Accept(1 << 16); };
    hooks.handle = [this](HttpHead, std::string, std::shared_ptr<HttpExchange> ex) { Answer(std::move(ex)); };
    auto s = HttpServer::Start(o, std::move(hooks));
    if (!s) ADD_FAILURE() << s.error().ToString();
    else server_ = std::move(*s);
  }
  ~ImageHost() {
    stop_ = true;
    if (server_) server_->Stop();
    std::lock_guard lock(mu_);
    for (auto& t : writers_) t.join();
  }
  std::string Url(int n) const {
    return "http://127.0.0.1:" + std::to_string(server_ ? server_->port() : 0) + "/shot" + std::to_string(n) + ".png";
  }
  int requests() const { return requests_.load(); }
  int open() const { return open_.load(); }

 private:
  void Answer(std::shared_ptr<HttpExchange> ex) {
    ++requests_;
    if (!trickle_) return ex->Reply(moeserve::daemon::HttpResponse{200, "image/png", {}, png_});
    ++open_;
    ex->BeginStream(200, "image/png", {});
    std::lock_guard lock(mu_);
    writers_.emplace_back([this, ex] {
      for (size_t i = 0; !stop_; ++i) {
        if (ex->Write(std::string(1, png_[i % png_.size()])) != HttpExchange::WriteResult::kQueued) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      --open_;
    });
  }

  std::string png_;
  bool trickle_;
  std::atomic<int> requests_{0}, open_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::thread> writers_;
  std::unique_ptr<HttpServer> server_;
};

// A chat message with a text part and one image part per URL.
inline json ImageChatMessages(const std::vector<std::string>& urls, const std::string& text = "What is in the picture?") {
  json content = json::array({{{"type", "text"}, {"text", text}}});
  for (const auto& u : urls) content.push_back({{"type", "image_url"}, {"image_url", {{"url", u}}}});
  return json::array({{{"role", "user"}, {"content", content}}});
}

// A counter's value in a Prometheus text scrape (the sample without labels), or -1 when absent.
inline double CounterValue(const std::string& scrape, const std::string& name) {
  const std::string at = "\n" + name + " ";
  const size_t p = scrape.find(at);
  if (p == std::string::npos) return -1;
  return std::stod(scrape.substr(p + at.size()));
}

}  // namespace moeserve::daemon::testing

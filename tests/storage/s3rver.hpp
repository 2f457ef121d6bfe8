// Runs s3rver (npm, a real S3 protocol server) on an ephemeral loopback port
// with a temporary data folder, and uploads model folders into it.
#pragma once

#include <curl/curl.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "moeserve/storage/sigv4.hpp"
#include "test_servers.hpp"

namespace moeserve::testing {

class S3rver {
 public:
  static constexpr const char* kAccessKey = "S3RVER";  // s3rver's built-in account
  static constexpr const char* kSecretKey = "S3RVER";

  // Empty unique_ptr (and *why set) when node or s3rver are not installed.
  // With cert and key (PEM files), s3rver serves https.
  static std::unique_ptr<S3rver> Start(const std::string& bucket, std::string* why, const std::string& cert = "",
                                       const std::string& key = "") {
    std::string script = SourceDir() + "/node_modules/s3rver/bin/s3rver.js";
    if (!std::filesystem::exists(script)) {
      *why = "s3rver is not installed (run scripts/setup: npm ci)";
      return nullptr;
    }
    if (std::system("node --version > /dev/null 2>&1") != 0) {
      *why = "node is not installed";
      return nullptr;
    }
    auto s = std::unique_ptr<S3rver>(new S3rver());
    s->dir_ = MakeTempDir("s3rver");
    // --service-endpoint localhost: virtual-host requests to <bucket>.s3.localhost resolve the bucket.
    std::vector<std::string> argv = {"node", script, "-d", s->dir_, "-a", "127.0.0.1", "-p", "0", "--silent",
                                     "--configure-bucket", bucket, "--service-endpoint", "localhost"};
    if (!cert.empty()) argv.insert(argv.end(), {"--cert", cert, "--key", key});
    s->tls_ = !cert.empty();
    s->process_ = std::make_unique<Subprocess>(argv);
    std::string line = s->process_->WaitForLine("listening on", std::chrono::seconds(30));
    if (line.empty()) {
      *why = "s3rver did not start";
      return nullptr;
    }
    s->port_ = std::stoi(line.substr(line.rfind(':') + 1));
    return s;
  }
  ~S3rver() {
    process_.reset();
    std::filesystem::remove_all(dir_);
  }
  int port() const { return port_; }
  std::string endpoint() const { return (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(port_); }

  // PUTs every file under dir to bucket/prefix<relative path> (anonymous: s3rver allows it).
  bool UploadDir(const std::string& bucket, const std::string& prefix, const std::string& dir) const {
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      std::string rel = std::filesystem::relative(e.path(), dir).generic_string();
      if (!Put(bucket, prefix + rel, e.path().string())) return false;
    }
    return true;
  }

  bool Put(const std::string& bucket, const std::string& key, const std::string& file) const {
    std::ifstream in(file, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CURL* curl = curl_easy_init();
    std::string url = endpoint() + "/" + bucket + "/" + storage::AwsUriEncode(key, false);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, data.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(data.size()));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t s, size_t n, void*) { return s * n; });
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);  // test uploads only
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    return rc == CURLE_OK && status == 200;
  }

 private:
  S3rver() = default;
  std::string dir_;
  std::unique_ptr<Subprocess> process_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace moeserve::testing

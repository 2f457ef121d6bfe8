// A real TLS peer for redirect tests: `openssl s_server -HTTP` on an
// ephemeral loopback port, with a self-signed certificate made by the
// openssl CLI. In -HTTP mode s_server answers "GET /name" with the file
// `name` of its folder sent as is, so each file holds a whole HTTP response
// (a 302 with a Location, or a 200 with a body).
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "test_servers.hpp"

namespace moeserve::testing {

class OpenSslHttpServer {
 public:
  // Empty unique_ptr (and *why set) when the openssl CLI is missing or does not start.
  static std::unique_ptr<OpenSslHttpServer> Start(std::string* why) {
    auto s = std::unique_ptr<OpenSslHttpServer>(new OpenSslHttpServer());
    s->dir_ = MakeTempDir("s-server");
    std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
                      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " + s->dir_ + "/.key.pem -out " +
                      s->dir_ + "/.cert.pem > /dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      *why = "openssl CLI not available";
      return nullptr;
    }
    // s_server serves files relative to its working directory.
    std::string run = "cd '" + s->dir_ + "' && exec openssl s_server -accept 127.0.0.1:0 -cert .cert.pem "
                      "-key .key.pem -HTTP";
    s->process_ = std::make_unique<Subprocess>(std::vector<std::string>{"sh", "-c", run});
    std::string line = s->process_->WaitForLine("ACCEPT", std::chrono::seconds(20));
    if (line.empty()) {
      *why = "openssl s_server did not start";
      return nullptr;
    }
    s->port_ = std::stoi(line.substr(line.rfind(':') + 1));
    return s;
  }
  ~OpenSslHttpServer() {
    process_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_) + "/"; }
  std::string ca_file() const { return dir_ + "/.cert.pem"; }

  // GET /name answers 302 Found to location.
  void Redirect(const std::string& name, const std::string& location) const {
    Write(name, "HTTP/1.0 302 Found\r\nLocation: " + location + "\r\nContent-Length: 0\r\n\r\n");
  }
  // GET /name answers 200 with body (s_server ignores Range: the whole body each time).
  void Serve(const std::string& name, const std::string& body) const {
    Write(name, "HTTP/1.0 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }

 private:
  OpenSslHttpServer() = default;
  void Write(const std::string& name, const std::string& response) const {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << response;
  }
  std::string dir_;
  std::unique_ptr<Subprocess> process_;
  int port_ = 0;
};

}  // namespace moeserve::testing

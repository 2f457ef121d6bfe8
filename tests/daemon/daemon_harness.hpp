// Shared helpers for the daemon's HTTP tests: a tiny generated model, an
// in-process Daemon on a free loopback port, and a raw HTTP/1.1 client (raw
// so that tests can send malformed bytes, read SSE as it streams, and hang up
// mid-stream).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../support/loopback.hpp"
#include "moeserve/daemon/daemon.hpp"
#include "moeserve/engine/model_config.hpp"
#include "moeserve/engine/model_gen.hpp"

namespace moeserve::daemon::testing {

using json = nlohmann::json;
using test_support::ConnectLoopback;
using test_support::FreeLoopbackPort;

inline const std::string& TinyModelDir() {
  static std::string dir = [] {
    std::string d = ::testing::TempDir() + "/moe_daemon_tiny_" + std::to_string(::getpid());
    std::filesystem::remove_all(d);
    engine::ModelGenOptions o;
    o.config = *engine::PresetConfig("tiny");
    o.seed = 1;
    auto st = engine::GenerateModel(o, d);
    if (!st) ADD_FAILURE() << st.error().ToString();
    return d;
  }();
  return dir;
}

inline DaemonConfig TestConfig() {
  DaemonConfig c;
  c.model = TinyModelDir();
  c.served_model_name = "tiny";
  c.port = FreeLoopbackPort();
  c.max_context = 4096;
  c.cache_tokens = 1 << 16;
  c.default_max_tokens = 16;
  c.thinking_budgets = engine::ThinkingBudgets{4, 8, 16};
  c.default_reasoning_effort = ReasoningEffort::kLow;
  c.shutdown_grace_seconds = 5;
  c.constrained_max_string_bytes = 24;  // random weights fill every string to the bound
  return c;
}

inline std::unique_ptr<Daemon> StartDaemon(DaemonConfig c = TestConfig()) {
  auto d = Daemon::Create(c);
  if (!d) {
    ADD_FAILURE() << d.error().ToString();
    return nullptr;
  }
  auto st = (*d)->Start();
  // FreeLoopbackPort's port is free when picked, not when the daemon binds
  // it: a test process beside this one (ctest -j2) may take it between the
  // two. Such a start tries fresh ports; the tests read the port back from
  // the daemon (PortOf).
  for (int retry = 0; !st && retry < 4 && st.error().ToString().find("Address already in use") != std::string::npos;
       ++retry) {
    c.port = FreeLoopbackPort();
    d->reset();  // its state (files, locks) released before the next one takes it
    d = Daemon::Create(c);
    if (!d) {
      ADD_FAILURE() << d.error().ToString();
      return nullptr;
    }
    st = (*d)->Start();
  }
  if (!st) ADD_FAILURE() << st.error().ToString();
  st = (*d)->LoadModel();
  if (!st) ADD_FAILURE() << st.error().ToString();
  return std::move(*d);
}

inline int PortOf(const Daemon& d) { return std::stoi(d.url().substr(d.url().rfind(':') + 1)); }

// A test suite whose tests share one daemon, started once for the suite
// (loading the model per test would dominate the run). A suite that needs
// another configuration defines its own SetUpTestSuite calling StartShared.
class SharedDaemonSuite : public ::testing::Test {
 protected:
  static void StartShared(DaemonConfig c = TestConfig()) {
    daemon_ = StartDaemon(std::move(c)).release();
    port_ = daemon_ ? PortOf(*daemon_) : 0;
  }
  static void SetUpTestSuite() { StartShared(); }
  static void TearDownTestSuite() {
    if (daemon_) daemon_->Shutdown(1);
    delete daemon_;
    daemon_ = nullptr;
  }
  inline static Daemon* daemon_ = nullptr;
  inline static int port_ = 0;
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  std::string error;                           // transport failure, if any
  json Json() const { return json::parse(body, nullptr, false); }
  // The payloads of "data: ..." events.
  std::vector<std::string> Events() const {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
      pos = end + 2;
    }
    return out;
  }
};

inline bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

inline std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t n = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (n == 0) break;
    out += raw.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return out;
}

inline HttpResponse ParseResponse(const std::string& raw) {
  HttpResponse r;
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    r.error = "no response head (" + std::to_string(raw.size()) + " bytes)";
    return r;
  }
  std::string head = raw.substr(0, head_end);
  r.status = std::stoi(head.substr(head.find(' ') + 1, 3));
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos && pos < head.size()) {
    size_t next = head.find("\r\n", pos + 2);
    std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(ch));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value[0] == ' ') value.erase(0, 1);
      r.headers[name] = value;
    }
    pos = next;
  }
  std::string body = raw.substr(head_end + 4);
  auto te = r.headers.find("transfer-encoding");
  r.body = (te != r.headers.end() && te->second.find("chunked") != std::string::npos) ? Dechunk(body) : body;
  return r;
}

// Reads one response: to Content-Length, to the last chunk, or to EOF
// (the server may keep the connection open despite Connection: close).
inline bool ResponseComplete(const std::string& raw) {
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  std::string head = raw.substr(0, head_end);
  for (auto& ch : head) ch = static_cast<char>(std::tolower(ch));
  size_t cl = head.find("content-length:");
  if (cl != std::string::npos) return raw.size() >= head_end + 4 + std::stoul(head.substr(cl + 15));
  if (head.find("chunked") != std::string::npos) {
    return raw.size() >= 5 && (raw.compare(raw.size() - 5, 5, "0\r\n\r\n") == 0);
  }
  return false;
}

inline std::string ReadResponse(int fd) {
  std::string raw;
  char buf[65536];
  while (!ResponseComplete(raw)) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  return raw;
}

// One request on its own connection (Connection: close), read to the end.
inline HttpResponse Http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                         const std::map<std::string, std::string>& headers = {}, bool content_type_json = true) {
  int fd = ConnectLoopback(port);
  if (fd < 0) return HttpResponse{0, {}, "", "connect failed"};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (content_type_json && !body.empty()) req += "Content-Type: application/json\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  SendAll(fd, req);
  std::string raw = ReadResponse(fd);
  ::close(fd);
  return ParseResponse(raw);
}

inline HttpResponse Chat(int port, const json& body, const std::map<std::string, std::string>& headers = {}) {
  return Http(port, "POST", "/v1/chat/completions", body.dump(), headers);
}

// The tests that drive a live daemon with the official `openai` npm client
// run a script under tests/daemon that prints "all checks passed".
inline std::string SourceRoot() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return src ? src : ".";
}

// node and node_modules/openai are installed (scripts/setup installs them).
inline bool OpenAiClientInstalled() {
  return std::system("command -v node >/dev/null 2>&1") == 0 &&
         std::filesystem::exists(SourceRoot() + "/node_modules/openai/package.json");
}

struct ClientScriptRun {
  int status = -1;
  std::string output;
};

// Runs `node SCRIPT ARGUMENT` from the source root.
inline ClientScriptRun RunOpenAiClientScript(const std::string& script, const std::string& argument) {
  const std::string cmd = "cd '" + SourceRoot() + "' && node " + script + " " + argument + " 2>&1";
  ClientScriptRun run;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return run;
  char buf[1024];
  while (fgets(buf, sizeof(buf), p)) run.output += buf;
  run.status = ::pclose(p);
  return run;
}

inline json UserTurn(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }

}  // namespace moeserve::daemon::testing

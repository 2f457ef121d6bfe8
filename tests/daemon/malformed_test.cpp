// daemon.malformed: fuzzed JSON, huge strings, wrong types, 10 MB bodies,
// invalid UTF-8, broken HTTP: every one gets a 4xx (never a 5xx or a hang),
// and the daemon keeps serving.
#include <gtest/gtest.h>

#include <random>

#include "daemon_harness.hpp"

namespace moeserve::daemon::testing {
namespace {

class Malformed : public SharedDaemonSuite {
 protected:
  static void ExpectClientError(const std::string& body, const std::string& what) {
    auto r = Http(port_, "POST", "/v1/chat/completions", body);
    EXPECT_GE(r.status, 400) << what << ": " << r.body.substr(0, 300);
    EXPECT_LT(r.status, 500) << what << ": " << r.body.substr(0, 300);
    if (r.status >= 400) {
      auto j = r.Json();
      EXPECT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r.body.substr(0, 300);
    }
  }
  static void ExpectAlive() {
    auto r = Chat(port_, {{"messages", UserTurn("still there?")}, {"max_tokens", 2}});
    ASSERT_EQ(r.status, 200) << r.body;
  }
};

const std::string kValid =
    R"({"model":"tiny","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],)"
    R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}],)"
    R"("tool_choice":"auto","max_tokens":2,"stop":["x"],"seed":1,"temperature":0.5})";

TEST_F(Malformed, FuzzedJson) {
  std::mt19937 rng(42);
  int ok = 0;
  for (int i = 0; i < 300; ++i) {
    std::string body = kValid;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0: body[at] = static_cast<char>(rng() % 256); break;
        case 1: body.erase(at, 1 + rng() % 8); break;
        case 2: body.insert(at, std::string(1, "{}[]\",:0a\\"[rng() % 10])); break;
        case 3: body = body.substr(0, at); break;
      }
      if (body.empty()) body = "{";
    }
    auto r = Http(port_, "POST", "/v1/chat/completions", body);
    EXPECT_NE(r.status, 0) << "no answer to: " << body;
    EXPECT_LT(r.status, 500) << body << " -> " << r.body;
    if (r.status == 200) ++ok;
  }
  ExpectAlive();
}

TEST_F(Malformed, WrongTypesEverywhere) {
  const json base = json::parse(kValid);
  const std::vector<json> junk = {nullptr, 1, -1, 1.5, true, "s", json::array(), json::object(), json::array({1, 2})};
  // Replace each field (and each field of the first messages/tools) with every junk value.
  std::vector<json::json_pointer> paths;
  for (auto& [k, v] : base.items()) paths.push_back(json::json_pointer("/" + k));
  for (const char* p : {"/messages/0", "/messages/1/role", "/messages/1/content", "/tools/0", "/tools/0/function",
                        "/tools/0/function/name", "/tools/0/function/parameters", "/stop/0"})
    paths.push_back(json::json_pointer(p));
  for (const auto& p : paths) {
    for (const auto& j : junk) {
      json body = base;
      body[p] = j;
      auto r = Http(port_, "POST", "/v1/chat/completions", body.dump());
      EXPECT_NE(r.status, 0) << p.to_string();
      EXPECT_LT(r.status, 500) << p.to_string() << " = " << j.dump() << " -> " << r.body;
    }
  }
  ExpectAlive();
}

TEST_F(Malformed, HugeAndInvalidBodies) {
  ExpectClientError(std::string(10 << 20, 'x'), "10 MB of junk");
  ExpectClientError(R"({"messages":[{"role":"user","content":")" + std::string(10 << 20, 'a') + "\"}]}", "10 MB string");
  ExpectClientError(R"({"messages":[{"role":"user","content":")" + std::string(200000, 'a') + "\"}]}",
                    "a prompt past the context window");
  ExpectClientError("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc0\xaf\"}]}", "invalid UTF-8");
  ExpectClientError("{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", "a UTF-8 surrogate");
  ExpectClientError(std::string(100000, '['), "deep nesting");
  {
    // Valid JSON, nested a million levels deep inside a tool's schema.
    std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
    ExpectClientError(R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"enum":[)" +
                          deep + "]}}}}}],\"tool_choice\":\"required\"}",
                      "a million-deep schema");
  }
  ExpectClientError("", "empty body");
  ExpectClientError("null", "null");
  ExpectClientError(R"({"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}],"tool_choice":"required"})",
                    "a tool whose parameters are not an object");
  ExpectAlive();
}

TEST_F(Malformed, BrokenHttp) {
  for (const std::string& raw : {std::string("GARBAGE\r\n\r\n"), std::string("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"),
                                std::string("\x00\x01\x02\r\n\r\n", 7)}) {
    int fd = ConnectLoopback(port_);
    ASSERT_GE(fd, 0);
    SendAll(fd, raw);
    ::shutdown(fd, SHUT_WR);
    std::string got = ReadResponse(fd);
    ::close(fd);
  }
  ExpectAlive();
}

}  // namespace
}  // namespace moeserve::daemon::testing

// daemon.audit_log: moe-daemon (its own process, the tiny model, a state
// directory) writes one JSON line per request to <state_dir>/audit:
//  - by default no prompt or answer text: a unique marker sent in a prompt
//    is nowhere in the files, nor is the API key (its hash prefix is);
//  - with audit_log_content the marker is there;
//  - SIGKILL right after responses were acknowledged loses none of their
//    lines (each answer's X-Request-Id is in the log after the kill);
//  - audit.log rotates by size into audit.log.1 .. audit.log.N and no
//    further, and the admin endpoint reads the rotated files in order;
//  - `moectl audit` prints the lines (JSON lines or a table), filtered by
//    tenant and time, and refuses a --since that is not a time.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "daemon_process.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::daemon::testing {
namespace {

constexpr const char* kTenantKey = "sk-audit-tenant-key-0123456789";
constexpr const char* kAdminKey = "sk-audit-admin-key-0123456789ab";

// Runs `moectl audit` against the daemon with the admin key; returns the
// exit status, `output` gets stdout and stderr.
int Moectl(int port, const std::string& args, std::string& output) {
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  const std::string moectl = std::string(bin ? bin : MOESERVE_BINARY_DIR_DEFAULT) + "/moectl/moectl";
  const std::string cmd = moectl + " audit --daemon http://127.0.0.1:" + std::to_string(port) + " --api-key " +
                          kAdminKey + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  output.clear();
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) output += buf;
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("audit-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "state");
    std::ofstream(dir_ / "keys.yaml") << "keys:\n  - {key: " << kTenantKey << ", tenant: acme}\n  - {key: " << kAdminKey
                                       << ", tenant: ops, role: admin}\n";
  }
  std::vector<std::string> Flags(std::vector<std::string> extra = {}) const {
    std::vector<std::string> f = {"--state-dir", (dir_ / "state").string(), "--api-keys-file", (dir_ / "keys.yaml").string()};
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  }
  // Every audit file's bytes, the rotated ones included.
  std::string AllAuditBytes() const {
    std::string all;
    for (const auto& e : std::filesystem::directory_iterator(dir_ / "state" / "audit")) {
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      all += ss.str();
    }
    return all;
  }
  std::vector<json> AuditLines() const {
    std::vector<json> out;
    std::stringstream in(AllAuditBytes());
    std::string line;
    while (std::getline(in, line)) out.push_back(json::parse(line));
    return out;
  }
  static HttpResponse Ask(int port, const std::string& text, bool stream = false) {
    json body = {{"messages", UserTurn(text)}, {"max_tokens", 4}};
    if (stream) body["stream"] = true;
    return Chat(port, body, {{"Authorization", std::string("Bearer ") + kTenantKey}});
  }
  std::filesystem::path dir_;
};

TEST_F(AuditLogTest, NoContentByDefaultAndOneLinePerRequest) {
  DaemonProcess d(Flags());
  ASSERT_TRUE(d.WaitReady());
  const std::string marker = "zebra-marker-" + std::to_string(::getpid()) + "-quartz";
  auto plain = Ask(d.port(), "tell me about " + marker);
  ASSERT_EQ(plain.status, 200) << plain.body;
  auto streamed = Ask(d.port(), "and stream " + marker, true);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  ASSERT_EQ(streamed.Events().back(), "[DONE]");
  auto refused = Chat(d.port(), {{"messages", UserTurn(marker)}}, {{"Authorization", "Bearer sk-wrong-key-000000000"}});
  ASSERT_EQ(refused.status, 401);

  // A refusal from the head is logged without holding its answer back.
  for (int i = 0; i < 500 && AuditLines().size() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string bytes = AllAuditBytes();
  EXPECT_EQ(bytes.find(marker), std::string::npos) << "prompt text in the audit log by default";
  EXPECT_EQ(bytes.find(kTenantKey), std::string::npos) << "an API key in the audit log";
  EXPECT_EQ(bytes.find("sk-wrong-key"), std::string::npos);
  const auto lines = AuditLines();
  ASSERT_EQ(lines.size(), 3u) << bytes;
  const json& first = lines[0];
  EXPECT_EQ(first["tenant"], "acme");
  EXPECT_EQ(first["key_id"], Sha256Hex(std::string_view(kTenantKey)).substr(0, 16));
  EXPECT_EQ(first["endpoint"], "/v1/chat/completions");
  EXPECT_EQ(first["model"], "tiny");
  EXPECT_EQ(first["tier"], "low");
  EXPECT_EQ(first["status"], 200);
  EXPECT_EQ(first["request_id"], plain.headers["x-request-id"]);
  EXPECT_EQ(first["completion_id"], plain.Json()["id"]);
  EXPECT_EQ(first["tokens"]["prompt"], plain.Json()["usage"]["prompt_tokens"]);
  EXPECT_EQ(first["tokens"]["completion"], plain.Json()["usage"]["completion_tokens"]);
  EXPECT_FALSE(first.contains("content"));
  EXPECT_EQ(lines[1]["stream"], true);
  EXPECT_EQ(lines[1]["request_id"], streamed.headers["x-request-id"]);
  EXPECT_GT(lines[1]["tokens"]["prompt"].get<int>(), 0);
  EXPECT_EQ(lines[2]["status"], 401);
  EXPECT_TRUE(lines[2]["tenant"].is_null());
}

TEST_F(AuditLogTest, ContentLoggingIsExplicit) {
  DaemonProcess d(Flags({"--audit-log-content", "true"}));
  ASSERT_TRUE(d.WaitReady());
  const std::string marker = "walrus-marker-" + std::to_string(::getpid()) + "-topaz";
  auto r = Ask(d.port(), "tell me about " + marker);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto lines = AuditLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0]["content"]["request"].dump().find(marker), std::string::npos) << lines[0].dump();
  EXPECT_TRUE(lines[0]["content"]["response"].is_string());
}

// The Responses API is audited as chat completions are: a line per request
// with its tokens, a stream acknowledged (its response.completed or
// response.incomplete held) only once its line is on disk and not logged as
// cut short, and a background run a line of its own with the run's tokens.
TEST_F(AuditLogTest, ResponsesAreAuditedLikeChatCompletions) {
  DaemonProcess d(Flags({"--audit-log-content", "true"}));
  ASSERT_TRUE(d.WaitReady());
  const std::map<std::string, std::string> key = {{"Authorization", std::string("Bearer ") + kTenantKey}};
  auto post = [&](json body) { return Http(d.port(), "POST", "/v1/responses", body.dump(), key); };
  auto plain = post({{"input", "tell me"}, {"max_output_tokens", 4}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  auto streamed = post({{"input", "and stream"}, {"max_output_tokens", 4}, {"stream", true}});
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  ASSERT_TRUE(streamed.body.find("event: response.incomplete") != std::string::npos ||
              streamed.body.find("event: response.completed") != std::string::npos)
      << streamed.body;
  auto background = post({{"input", "in the background"}, {"max_output_tokens", 4}, {"background", true}});
  ASSERT_EQ(background.status, 200) << background.body;
  const std::string id = background.Json()["id"];
  std::string status = "in_progress";
  for (int i = 0; i < 400 && status == "in_progress"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = Http(d.port(), "GET", "/v1/responses/" + id, "", key).Json()["status"];
  }
  ASSERT_NE(status, "in_progress");

  std::vector<json> posts;
  for (int i = 0; i < 500 && posts.size() < 4; ++i) {
    posts.clear();
    for (const auto& l : AuditLines())
      if (l["method"] == "POST" && l["endpoint"] == "/v1/responses") posts.push_back(l);
    if (posts.size() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(posts.size(), 4u);
  const json& first = posts[0];
  EXPECT_EQ(first["request_id"], plain.headers["x-request-id"]);
  EXPECT_EQ(first["status"], 200);
  EXPECT_EQ(first["tokens"]["prompt"], plain.Json()["usage"]["input_tokens"]);
  EXPECT_EQ(first["tokens"]["completion"], plain.Json()["usage"]["output_tokens"]);
  EXPECT_FALSE(first["content"]["response"].get<std::string>().empty()) << first.dump();
  const json& second = posts[1];
  EXPECT_EQ(second["request_id"], streamed.headers["x-request-id"]);
  EXPECT_EQ(second["stream"], true);
  EXPECT_FALSE(second.contains("stream_error")) << second.dump();
  EXPECT_GT(second["tokens"]["prompt"].get<int>(), 0);
  EXPECT_FALSE(second["content"]["response"].get<std::string>().empty()) << second.dump();
  // The background request's answer, and its run with the run's tokens (in either order).
  int runs = 0;
  for (const json* l : {&posts[2], &posts[3]}) {
    if ((*l)["tokens"]["prompt"].get<int>() > 0) {
      ++runs;
      EXPECT_EQ((*l)["status"], 200);
      EXPECT_FALSE((*l)["completion_id"].is_null());
    } else {
      EXPECT_EQ((*l)["request_id"], background.headers["x-request-id"]);
    }
  }
  EXPECT_EQ(runs, 1);
}

TEST_F(AuditLogTest, SigkillAfterAcknowledgementLosesNoLine) {
  DaemonProcess d(Flags());
  ASSERT_TRUE(d.WaitReady());
  std::vector<std::string> acknowledged;
  for (int i = 0; i < 6; ++i) {
    auto r = Ask(d.port(), "turn " + std::to_string(i), i % 2 == 1);
    ASSERT_EQ(r.status, 200) << r.body;
    if (i % 2 == 1) {
      ASSERT_EQ(r.Events().back(), "[DONE]");
    }
    acknowledged.push_back(r.headers["x-request-id"]);
  }
  d.Kill();  // SIGKILL: no flush, no destructor
  std::set<std::string> logged;
  for (const auto& l : AuditLines()) logged.insert(l["request_id"].get<std::string>());
  for (const auto& id : acknowledged) {
    ASSERT_FALSE(id.empty());
    EXPECT_TRUE(logged.contains(id)) << "acknowledged request " << id << " missing after SIGKILL";
  }

  // A line half written when the process died (its answer never went out)
  // is cut at the next start; the log goes on after the last whole line.
  std::ofstream(dir_ / "state" / "audit" / "audit.log", std::ios::app) << R"({"time":"2026-12-05T06:00:00Z","requ)";
  DaemonProcess again(Flags());
  ASSERT_TRUE(again.WaitReady()) << "moe-daemon did not start again on its audit log";
  auto after = Ask(again.port(), "after the restart");
  ASSERT_EQ(after.status, 200) << after.body;
  const auto lines = AuditLines();  // every line parses (json::parse throws on a torn one)
  ASSERT_EQ(lines.size(), acknowledged.size() + 1);
  EXPECT_EQ(lines.back()["request_id"], after.headers["x-request-id"]);
}

TEST_F(AuditLogTest, RotatesBySizeAndMoectlPrintsTheLines) {
  DaemonProcess d(Flags({"--audit-max-file-bytes", "4096", "--audit-max-files", "2"}));
  ASSERT_TRUE(d.WaitReady());
  // Each line is some 350 bytes: 45 requests fill more than three files.
  std::vector<std::string> ids;
  for (int i = 0; i < 45; ++i) {
    auto r = Ask(d.port(), "rotation " + std::to_string(i));
    ASSERT_EQ(r.status, 200) << r.body;
    ids.push_back(r.headers["x-request-id"]);
  }
  const auto audit = dir_ / "state" / "audit";
  EXPECT_TRUE(std::filesystem::exists(audit / "audit.log.1"));
  EXPECT_TRUE(std::filesystem::exists(audit / "audit.log.2"));
  EXPECT_FALSE(std::filesystem::exists(audit / "audit.log.3")) << "audit_max_files 2 keeps two rotated files";
  for (const auto& e : std::filesystem::directory_iterator(audit))
    EXPECT_LT(std::filesystem::file_size(e.path()), 4096u + 1024u) << e.path();

  std::string output;
  ASSERT_EQ(Moectl(d.port(), "--tenant acme -o json", output), 0) << output;
  std::vector<std::string> printed;
  std::stringstream in(output);
  std::string line;
  while (std::getline(in, line)) printed.push_back(json::parse(line)["request_id"]);
  // Oldest first, across the rotated files: the newest request is last.
  ASSERT_GE(printed.size(), 8u) << output;
  EXPECT_LT(printed.size(), ids.size()) << "the oldest file was rotated away";
  EXPECT_EQ(printed.back(), ids.back());
  for (size_t i = 1; i < printed.size(); ++i) {
    auto at = std::find(ids.begin(), ids.end(), printed[i]);
    auto before = std::find(ids.begin(), ids.end(), printed[i - 1]);
    EXPECT_LT(before - ids.begin(), at - ids.begin()) << "out of order: " << output;
  }
  // The table names the columns and shows the newest request; --since
  // filters by time and refuses what is not a time, naming it.
  std::string table;
  ASSERT_EQ(Moectl(d.port(), "--limit 3", table), 0) << table;
  EXPECT_TRUE(table.starts_with("TIME")) << table;
  EXPECT_NE(table.find(ids.back()), std::string::npos) << table;
  EXPECT_NE(table.find("/v1/chat/completions"), std::string::npos) << table;
  std::string later;
  ASSERT_EQ(Moectl(d.port(), "--since 2999-01-01T00:00:00Z", later), 0) << later;
  EXPECT_EQ(later, "No audit lines found.\n");
  std::string bad;
  EXPECT_EQ(Moectl(d.port(), "--since yesterday", bad), 1) << bad;
  EXPECT_NE(bad.find("since"), std::string::npos) << bad;

  // A tenant's key may not read the audit log.
  auto tenant = Http(d.port(), "GET", "/v1/admin/audit", "", {{"Authorization", std::string("Bearer ") + kTenantKey}});
  EXPECT_EQ(tenant.status, 403);
}

}  // namespace
}  // namespace moeserve::daemon::testing

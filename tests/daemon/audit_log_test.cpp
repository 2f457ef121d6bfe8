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
//    tenant and time, and refuses a --since that is not a time;
//  - 800 requests without a key cannot flush a tenant's line: they are
//    counted and sampled, not written line for line;
//  - rotation never deletes an authenticated line younger than
//    audit_retention_hours: the log fills, new requests get 503
//    audit_log_full, refusal lines are dropped and counted; once the lines
//    have aged, rotation deletes them (counted) and requests are admitted.
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "daemon_process.hpp"
#include "moeserve/common/rfc3339.hpp"
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

// One sample of /metrics, read with the admin key (-1: not there).
double Metric(int port, const std::string& sample) {
  const auto m = Http(port, "GET", "/metrics", "", {{"Authorization", std::string("Bearer ") + kAdminKey}});
  const size_t at = m.body.find("\n" + sample + " ");
  return at == std::string::npos ? -1.0 : std::stod(m.body.substr(at + sample.size() + 2));
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
  // Greedy, so the answers are the same every run: sampled, the tiny model
  // may end its answer on the first token and leave nothing to audit.
  auto plain = post({{"input", "tell me"}, {"max_output_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  auto streamed = post({{"input", "and stream"}, {"max_output_tokens", 4}, {"temperature", 0}, {"stream", true}});
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
  std::string answered;  // what the client read: every output item's text
  const json plain_body = plain.Json();
  for (const auto& item : plain_body["output"])
    for (const char* list : {"summary", "content"})
      if (item.contains(list))
        for (const auto& part : item[list])
          if (part.contains("text")) answered += part["text"].get<std::string>();
  ASSERT_FALSE(answered.empty()) << plain.body;
  EXPECT_EQ(first["content"]["response"], answered) << first.dump();
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
  // Retention 0: rotation may delete the oldest file whatever it holds.
  DaemonProcess d(Flags({"--audit-max-file-bytes", "4096", "--audit-max-files", "2", "--audit-retention-hours", "0"}));
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
  EXPECT_GE(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"rotated\"}"), 8.0) << "deleted lines are counted";
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

// The attack as reported: keyless POSTs at a high rate rotated a tenant's
// line away. Now they are counted and sampled; the tenant's line stays.
TEST_F(AuditLogTest, KeylessRequestsCannotFlushATenantsLine) {
  DaemonProcess d(Flags({"--audit-max-file-bytes", "4096", "--audit-max-files", "1"}));
  ASSERT_TRUE(d.WaitReady());
  auto asked = Ask(d.port(), "who asked this");
  ASSERT_EQ(asked.status, 200) << asked.body;
  const std::string id = asked.headers["x-request-id"];
  const std::string body = json{{"messages", UserTurn("x")}}.dump();
  constexpr int kKeyless = 800;
  for (int i = 0; i < kKeyless; ++i)
    ASSERT_EQ(Http(d.port(), "POST", "/v1/chat/completions", body, i % 2 ? std::map<std::string, std::string>{}
                   : std::map<std::string, std::string>{{"Authorization", "Bearer sk-wrong-key-000000000"}}).status, 401);
  ASSERT_EQ(Metric(d.port(), "moe_audit_unauthenticated_refusals_total"), kKeyless);
  // Every line written is on disk once the sampled lines are counted (they are not waited for).
  std::vector<json> lines;
  for (int i = 0; i < 500; ++i) {
    lines = AuditLines();
    if (lines.size() - 1 + Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"sampled\"}") == kKeyless) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const json& l) { return l["request_id"] == id; }))
      << "the tenant's line was flushed by keyless requests";
  int sampled = 0;
  uint64_t skipped = 0;
  for (const auto& l : lines) {
    if (!l["tenant"].is_null()) continue;
    ++sampled;
    EXPECT_EQ(l["status"], 401);
    skipped += l["skipped_refusals"].get<uint64_t>();
  }
  EXPECT_GE(sampled, 1);
  EXPECT_LT(sampled, kKeyless / 10) << "keyless refusals written line for line";
  EXPECT_EQ(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"sampled\"}"), kKeyless - sampled);
  EXPECT_LE(skipped, static_cast<uint64_t>(kKeyless - sampled));  // those after the last sample are in no line yet
  EXPECT_EQ(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"rotated\"}"), 0.0);
}

// audit.log and one rotated file of 4 KiB, an hour's retention: once both
// hold only authenticated lines of the last hour, rotation would have to
// delete one, so the daemon refuses new audited requests instead.
TEST_F(AuditLogTest, RetentionRefusesNewRequestsRatherThanDeleteAnAuthenticatedLine) {
  DaemonProcess d(Flags({"--audit-max-file-bytes", "4096", "--audit-max-files", "1", "--audit-retention-hours", "1"}));
  ASSERT_TRUE(d.WaitReady());
  std::vector<std::string> served;
  HttpResponse r;
  for (int i = 0; i < 60; ++i) {  // some 12 lines a file
    r = Ask(d.port(), "fill " + std::to_string(i));
    if (r.status != 200) break;
    served.push_back(r.headers["x-request-id"]);
  }
  ASSERT_EQ(r.status, 503) << "never refused after " << served.size() << " requests: " << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "audit_log_full");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("audit_retention_hours"), std::string::npos);
  EXPECT_GE(served.size(), 16u);
  EXPECT_EQ(Metric(d.port(), "moe_audit_log_full"), 1.0);
  // Refusals while full (the 503's own, one without a key): counted, not written.
  const double full_drops = Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"full\"}");
  EXPECT_GE(full_drops, 1.0);
  ASSERT_EQ(Chat(d.port(), {{"messages", UserTurn("x")}}).status, 401);
  EXPECT_EQ(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"full\"}"), full_drops + 1);
  EXPECT_EQ(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"rotated\"}"), 0.0);
  // Every served request's line is still there, and the volume stays bounded.
  std::set<std::string> logged;
  for (const auto& l : AuditLines())
    if (l["request_id"].is_string()) logged.insert(l["request_id"].get<std::string>());
  for (const auto& id : served) EXPECT_TRUE(logged.contains(id)) << id << " was deleted";
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "state" / "audit"))
    EXPECT_LT(std::filesystem::file_size(e.path()), 4096u + 1024u) << e.path();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "state" / "audit" / "audit.log.2"));
}

// One tenant floods the log with requests it gets refused (400s are still
// its authenticated lines): once the log is full, that tenant is refused,
// and another tenant, which holds little of the log, is still served and
// its lines written, until audit.log has used up its reserve.
TEST_F(AuditLogTest, AFloodingTenantFillsTheLogForItselfNotItsNeighbours) {
  constexpr const char* kBetaKey = "sk-audit-beta-key-0123456789abcd";
  std::ofstream(dir_ / "keys.yaml") << "keys:\n  - {key: " << kTenantKey << ", tenant: acme}\n  - {key: " << kBetaKey
                                     << ", tenant: beta}\n  - {key: " << kAdminKey << ", tenant: ops, role: admin}\n";
  DaemonProcess d(Flags({"--audit-max-file-bytes", "4096", "--audit-max-files", "1", "--audit-retention-hours", "1"}));
  ASSERT_TRUE(d.WaitReady());
  const std::map<std::string, std::string> acme = {{"Authorization", std::string("Bearer ") + kTenantKey}};
  const std::map<std::string, std::string> beta = {{"Authorization", std::string("Bearer ") + kBetaKey}};
  auto served = Chat(d.port(), {{"messages", UserTurn("beta before")}, {"max_tokens", 4}}, beta);
  ASSERT_EQ(served.status, 200) << served.body;
  HttpResponse r;
  int flood = 0;
  for (; flood < 400; ++flood) {  // some 20 lines a file
    r = Http(d.port(), "POST", "/v1/chat/completions", R"({"messages": 5})", acme);
    if (r.status != 400) break;
  }
  ASSERT_EQ(r.status, 503) << "acme never refused after " << flood << " bad requests: " << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "audit_log_full");
  EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find("tenant acme holds"), std::string::npos) << r.body;
  EXPECT_EQ(Metric(d.port(), "moe_audit_log_full"), 1.0);
  // beta is served on, its lines written, while acme stays refused.
  std::vector<std::string> beta_ids;
  for (int i = 0; i < 3; ++i) {
    auto b = Chat(d.port(), {{"messages", UserTurn("beta " + std::to_string(i))}, {"max_tokens", 4}}, beta);
    ASSERT_EQ(b.status, 200) << "beta was shut out by acme's flood: " << b.body;
    beta_ids.push_back(b.headers["x-request-id"]);
    EXPECT_EQ(Http(d.port(), "POST", "/v1/chat/completions", R"({"messages": 5})", acme).status, 503);
  }
  std::set<std::string> logged;
  for (const auto& l : AuditLines())
    if (l["request_id"].is_string()) logged.insert(l["request_id"].get<std::string>());
  for (const auto& id : beta_ids) EXPECT_TRUE(logged.contains(id)) << id << " not in the audit log";
  EXPECT_TRUE(logged.contains(served.headers["x-request-id"])) << "beta's first line was deleted";
  EXPECT_EQ(Metric(d.port(), "moe_audit_lines_dropped_total{reason=\"rotated\"}"), 0.0);
  // The reserve bounds what the others may add: beta too is refused at last, and audit.log stays within it.
  HttpResponse b;
  int more = 0;
  for (; more < 200; ++more) {
    b = Chat(d.port(), {{"messages", UserTurn("beta more")}, {"max_tokens", 4}}, beta);
    if (b.status != 200) break;
  }
  ASSERT_EQ(b.status, 503) << "beta never refused after " << more << " more requests";
  EXPECT_LT(std::filesystem::file_size(dir_ / "state" / "audit" / "audit.log"), 2 * 4096u + 1024u);
}

// A log of audit.log and one rotated file of 4 KiB, an hour's retention,
// in a fresh directory named `name`.
AuditSettings SmallRetainedLog(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  AuditSettings s;
  s.dir = dir.string();
  s.max_file_bytes = 4096;
  s.max_files = 1;
  s.retention_hours = 1;
  return s;
}

// The same rule on the log alone, with lines whose times the test writes:
// lines past retention rotate away (counted); lines within it fill the log;
// once they age past it, the next line's rotation deletes them and the log
// takes refusals again.
TEST(AuditLogRetention, FullUntilTheOldestAuthenticatedLineAgesPastRetention) {
  const AuditSettings s = SmallRetainedLog("audit-retention");
  auto log = AuditLog::Open(s);
  ASSERT_TRUE(log) << log.error().ToString();
  auto at = [](double seconds_ago) {
    const auto t = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                          std::chrono::duration<double>(seconds_ago));
    const std::time_t tt = std::chrono::system_clock::to_time_t(t);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
    return std::string(buf);
  };
  // A write returns once its line is on disk, before the writer rotates:
  // a later write's return says the earlier rotation has run.
  auto write = [&](double seconds_ago) {
    std::promise<Status> p;
    (*log)->Append(json{{"time", at(seconds_ago)}, {"tenant", "acme"}, {"pad", std::string(200, 'x')}}.dump(),
                   [&](const Status& st) { p.set_value(st); });
    return p.get_future().get();
  };
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(write(2 * 3600));  // two hours old: past retention
  EXPECT_GT((*log)->stats().dropped_rotated, 0u);
  EXPECT_FALSE((*log)->full());
  // Lines that pass retention in 3 s fill both files.
  for (int i = 0; i < 60 && !(*log)->full(); ++i) ASSERT_TRUE(write(3600 - 3));
  ASSERT_TRUE((*log)->full());
  const uint64_t rotated = (*log)->stats().dropped_rotated;
  std::promise<Status> refused;
  (*log)->Append("{\"tenant\":\"acme\"}", [&](const Status& st) { refused.set_value(st); }, AuditLineKind::kRefusal);
  ASSERT_TRUE(refused.get_future().get());
  EXPECT_EQ((*log)->stats().dropped_full, 1u);
  // A line of a request already admitted is still written while full, and deletes nothing.
  ASSERT_TRUE(write(0));
  ASSERT_TRUE(write(0));
  EXPECT_EQ((*log)->stats().dropped_rotated, rotated);
  EXPECT_TRUE((*log)->stats().full);
  for (int i = 0; i < 100 && (*log)->full(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE((*log)->full()) << "still full after the lines passed retention";
  ASSERT_TRUE(write(0));  // its rotation deletes the aged file
  ASSERT_TRUE(write(0));
  EXPECT_GT((*log)->stats().dropped_rotated, rotated);
  EXPECT_FALSE((*log)->stats().full);
}

// The tenant rule on the log alone: while full, only a tenant holding
// tenant_max_share of the bound is refused, until the reserve is spent;
// what a tenant holds is read back from the files when the log is reopened.
TEST(AuditLogRetention, WhileFullOnlyTheTenantHoldingItsShareIsRefused) {
  AuditSettings s = SmallRetainedLog("audit-share");
  s.tenant_max_share = 0.5;
  const std::filesystem::path dir = s.dir;
  auto log = AuditLog::Open(s);
  ASSERT_TRUE(log) << log.error().ToString();
  auto write = [&](AuditLog& l, const std::string& tenant) {
    std::promise<Status> p;
    l.Append(json{{"time", NowMicroTime()}, {"tenant", tenant}, {"pad", std::string(200, 'x')}}.dump(),
             [&](const Status& st) { p.set_value(st); }, AuditLineKind::kRequest, tenant);
    return p.get_future().get();
  };
  ASSERT_TRUE(write(**log, "beta"));
  for (int i = 0; i < 80 && !(*log)->full(); ++i) ASSERT_TRUE(write(**log, "acme"));
  ASSERT_TRUE((*log)->full());
  EXPECT_GE((*log)->RetainedBytes("acme"), 4096);
  EXPECT_TRUE((*log)->RefusesTenant("acme"));
  EXPECT_FALSE((*log)->RefusesTenant("beta"));
  EXPECT_FALSE((*log)->stats().reserve_spent);
  // Many small tenants, none near its share, use up the reserve: then every tenant is refused.
  for (int i = 0; i < 60 && !(*log)->RefusesTenant("gamma"); ++i) ASSERT_TRUE(write(**log, "t" + std::to_string(i)));
  EXPECT_TRUE((*log)->RefusesTenant("gamma")) << "the reserve never ran out";
  EXPECT_TRUE((*log)->stats().reserve_spent);
  EXPECT_GE(std::filesystem::file_size(dir / "audit.log"), 2 * 4096u);
  const int64_t acme_bytes = (*log)->RetainedBytes("acme");
  log->reset();
  auto reopened = AuditLog::Open(s);
  ASSERT_TRUE(reopened) << reopened.error().ToString();
  EXPECT_EQ((*reopened)->RetainedBytes("acme"), acme_bytes);
  EXPECT_GT((*reopened)->RetainedBytes("beta"), 0);
}

}  // namespace
}  // namespace moeserve::daemon::testing

// daemon.docs_example: the worked example of docs/http-api.md ("Worked
// example: two tenants, budgets and a hook") runs exactly as written. Its
// `file=` blocks are written to an empty directory under their names, its
// `sh` blocks are run in order by one bash (-e -u -o pipefail) with
// moe-daemon and moe-model-gen of this build on the PATH, and what the text
// promises is checked in their output: the daemon ready, acme answered,
// beta's `high` refused (tier_not_allowed), beta answered once then blocked
// (budget_exceeded, its worst case reserved), the hook's 50% delivery, and the
// month rows of /v1/usage summed per tenant.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "daemon_harness.hpp"

namespace moeserve::daemon {
namespace {

namespace fs = std::filesystem;

struct Example {
  std::vector<std::pair<std::string, std::string>> files;  // name -> content
  std::string script;
};

Example Extract(const std::string& docs) {
  Example ex;
  const size_t start = docs.find("\n### Worked example: two tenants, budgets and a hook\n");
  if (start == std::string::npos) return ex;
  size_t end = docs.find("\n## ", start + 1);
  const size_t next_sub = docs.find("\n### ", start + 1);
  if (next_sub < end) end = next_sub;
  std::stringstream in(docs.substr(start, end == std::string::npos ? std::string::npos : end - start));
  static const std::regex fence(R"(^```(\w*)(?: file=(\S+))?$)");
  std::string line, info_lang, file, body;
  bool inside = false;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!inside && std::regex_match(line, m, fence) && !m[1].str().empty()) {
      inside = true;
      info_lang = m[1];
      file = m[2];
      body.clear();
    } else if (inside && line == "```") {
      inside = false;
      if (!file.empty()) ex.files.emplace_back(file, body);
      else if (info_lang == "sh") ex.script += body;
    } else if (inside) {
      body += line + "\n";
    }
  }
  return ex;
}

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

struct ScriptRun {
  int status = -1;
  std::string output;
};

// bash in its own process group, so that whatever the script left running
// (it stops the daemon and receiver itself) is ended with it.
ScriptRun RunScript(const std::string& dir, const std::string& path_prefix) {
  int out[2];
  if (::pipe(out) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::close(out[1]);
    if (::chdir(dir.c_str()) != 0) std::_Exit(126);
    const std::string path = path_prefix + ":" + (std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
    ::setenv("PATH", path.c_str(), 1);
    ::execlp("timeout", "timeout", "-k", "5", "240", "bash", "-euo", "pipefail", "example.sh", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(out[1]);
  ScriptRun run;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) run.output.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  ::waitpid(pid, &run.status, 0);
  ::kill(-pid, SIGKILL);
  return run;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(what, pos)) != std::string::npos; pos += what.size()) ++n;
  return n;
}

TEST(DocsExample, TwoTenantsBudgetsAndAHookRunAsWritten) {
  std::ifstream in(testing::SourceRoot() + "/docs/http-api.md");
  std::stringstream docs;
  docs << in.rdbuf();
  const Example ex = Extract(docs.str());
  ASSERT_EQ(ex.files.size(), 3u) << "daemon.yaml, keys.yaml and hook_receiver.py blocks";
  ASSERT_NE(ex.script.find("moe-daemon serve --config daemon.yaml"), std::string::npos) << ex.script;
  // The example's fixed ports: another program on them would answer for it.
  ASSERT_TRUE(PortFree(18080) && PortFree(18081)) << "ports 18080 and 18081 must be free for the documented example";

  const std::string dir = ::testing::TempDir() + "/docs-example-" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [name, text] : ex.files) std::ofstream(dir + "/" + name) << text;
  std::ofstream(dir + "/example.sh") << ex.script;
  const char* bin = std::getenv("MOESERVE_BINARY_DIR");
  const std::string build = bin ? bin : MOESERVE_BINARY_DIR_DEFAULT;
  const ScriptRun run = RunScript(dir, build + "/daemon:" + build + "/engine");
  const std::string& out = run.output;
  auto daemon_log = [&] {
    std::ifstream log(dir + "/daemon.log");
    std::stringstream ss;
    ss << log.rdbuf();
    return ss.str();
  };
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0)
      << "the example failed (status " << run.status << "):\n" << out << "\n--- daemon.log:\n" << daemon_log();

  EXPECT_NE(out.find(R"({"status":"ready"})"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("object":"chat.completion")"), std::string::npos) << "acme and beta were answered\n" << out;
  EXPECT_NE(out.find("tier_not_allowed"), std::string::npos) << out;
  EXPECT_NE(out.find("\n200\n"), std::string::npos) << "beta's first low request is answered\n" << out;
  EXPECT_NE(out.find("budget_exceeded"), std::string::npos) << "beta's next request is blocked\n" << out;
  // The receiver printed the two deliveries: beta's day budget at 50%, and
  // at 100% by the refusal (spend stays short of it), with the refused amount.
  EXPECT_EQ(Count(out, R"("type":"budget.threshold")"), 2u) << out;
  EXPECT_EQ(Count(out, R"("tenant":"beta")"), 2u) << out;
  EXPECT_NE(out.find(R"("threshold":0.5)"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("threshold":1.0)"), std::string::npos) << out;
  EXPECT_EQ(Count(out, R"("refused_usd":)"), 1u) << out;
  EXPECT_NE(out.find(R"("policy":"standalone")"), std::string::npos) << out;
  // The month rows, per tenant.
  static const std::regex spent(R"((acme|beta) spent ([0-9.e-]+) USD this month)");
  std::map<std::string, double> by_tenant;
  for (std::sregex_iterator it(out.begin(), out.end(), spent), e; it != e; ++it) by_tenant[(*it)[1]] = std::stod((*it)[2]);
  ASSERT_EQ(by_tenant.size(), 2u) << out;
  EXPECT_GT(by_tenant["beta"], 0.03) << "beta's one answered request took more than half its $0.06 budget";
  EXPECT_LE(by_tenant["beta"], 0.06) << "the reservation kept beta within its block budget";
  EXPECT_GT(by_tenant["acme"], 0.0);
  EXPECT_LT(by_tenant["acme"], 50.0) << "acme stayed under its first threshold: no alert for acme";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::daemon

// Real Prometheus and Alertmanager for tests (Debian's prometheus and
// prometheus-alertmanager, installed by scripts/setup): child processes on
// free loopback ports, history backfilled with `promtool tsdb
// create-blocks-from openmetrics`, and the HTTP API read with curl.
//
// A child is SIGKILLed when its object is destroyed and, through
// PR_SET_PDEATHSIG, when the test process dies (a failed assertion, a crash,
// a ctest timeout): a test leaves no server behind.
//
// Thread safety: none; one test thread owns these objects.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loopback.hpp"

namespace moeserve::test_support {

struct ShellResult {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

inline ShellResult Shell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A folder of its own under TMPDIR (ctest gives each test one in the build tree).
inline std::filesystem::path FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  auto dir = std::filesystem::path(tmp ? tmp : "/tmp") / (name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::filesystem::path WriteFile(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p;
}

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ChildProcess {
 public:
  // Runs argv[0] (searched in PATH) with stdout and stderr to `log`.
  ChildProcess(const std::vector<std::string>& argv, std::filesystem::path log) : log_(std::move(log)) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::string log_path = log_.string();
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool Running() {
    if (pid_ <= 0) return false;
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
    return pid_ > 0;
  }
  // The end of what it wrote, for failure messages.
  std::string LogTail(size_t bytes = 3000) const {
    const std::string all = Slurp(log_);
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

// GET http://127.0.0.1:port<path> with URL-encoded query parameters; the body,
// or "" with rc != 0 when curl failed or the status was not 2xx.
inline ShellResult HttpGet(int port, const std::string& path,
                           const std::vector<std::pair<std::string, std::string>>& params = {}) {
  // Each parameter goes through a file so that no PromQL is shell-quoted.
  const auto dir = FreshDir("http-params");
  std::string args;
  int serial = 0;
  for (const auto& [name, value] : params) {
    const auto file = dir / std::to_string(serial++);
    std::ofstream(file) << value;
    args += " --data-urlencode '" + name + "@" + file.string() + "'";
  }
  auto r = Shell("curl -sS -f --max-time 10 -G" + args + " 'http://127.0.0.1:" + std::to_string(port) + path + "'");
  std::filesystem::remove_all(dir);
  return r;
}

// Polls GET /-/ready until it answers 200 or the process ends; false after ~20 s.
inline bool WaitReady(ChildProcess& process, int port) {
  for (int i = 0; i < 200; ++i) {
    if (!process.Running()) return false;
    if (HttpGet(port, "/-/ready").rc == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// One series of an OpenMetrics backfill: a sample every `step` seconds from
// `from` to `to` (Unix seconds), value(t) for each.
template <typename ValueAt>
void AppendSeries(std::string& out, const std::string& series, int64_t from, int64_t to, int64_t step, ValueAt value) {
  char buf[64];
  for (int64_t t = from; t <= to; t += step) {
    std::snprintf(buf, sizeof buf, " %.9g %lld\n", static_cast<double>(value(t)), static_cast<long long>(t));
    out += series;
    out += buf;
  }
}

// Turns OpenMetrics text (without the final "# EOF") into TSDB blocks in
// `data_dir`, which a Prometheus started on it then reads.
inline ShellResult Backfill(const std::string& openmetrics, const std::filesystem::path& data_dir) {
  const auto input = data_dir.parent_path() / (data_dir.filename().string() + ".om");
  std::ofstream(input) << openmetrics << "# EOF\n";
  return Shell("promtool tsdb create-blocks-from openmetrics '" + input.string() + "' '" + data_dir.string() + "'");
}

// Prometheus on a free port over dir/data (where Backfill wrote), with
// `config_yaml` as its configuration and any further flags; ready() false
// when it did not come up (see LogTail).
class Prometheus {
 public:
  Prometheus(const std::filesystem::path& dir, const std::string& config_yaml,
             const std::vector<std::string>& flags = {})
      : port_(FreeLoopbackPort()),
        config_(WriteFile(dir / "prometheus.yml", config_yaml)),
        process_(Arguments(dir, flags), dir / "prometheus.log") {
    ready_ = WaitReady(process_, port_);
  }
  bool ready() const { return ready_; }
  int port() const { return port_; }
  std::string LogTail() const { return process_.LogTail(); }
  // /api/v1/<endpoint> with parameters; the parsed answer or null.
  nlohmann::json Api(const std::string& endpoint, const std::vector<std::pair<std::string, std::string>>& params = {}) {
    auto r = HttpGet(port_, "/api/v1/" + endpoint, params);
    if (r.rc != 0) return nullptr;
    return nlohmann::json::parse(r.output, nullptr, false);
  }

 private:
  std::vector<std::string> Arguments(const std::filesystem::path& dir, const std::vector<std::string>& flags) const {
    std::vector<std::string> args = {"prometheus", "--config.file=" + config_.string(),
                                     "--storage.tsdb.path=" + (dir / "data").string(),
                                     "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  }

  int port_;
  std::filesystem::path config_;
  ChildProcess process_;
  bool ready_ = false;
};

// Alertmanager on a free port with `config_yaml`, clustering off.
class Alertmanager {
 public:
  Alertmanager(const std::filesystem::path& dir, const std::string& config_yaml)
      : port_(FreeLoopbackPort()),
        config_(WriteFile(dir / "alertmanager.yml", config_yaml)),
        process_({"prometheus-alertmanager", "--config.file=" + config_.string(),
                  "--storage.path=" + (dir / "alertmanager").string(),
                  "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--cluster.listen-address=",
                  "--log.level=warn"},
                 dir / "alertmanager.log") {
    ready_ = WaitReady(process_, port_);
  }
  bool ready() const { return ready_; }
  int port() const { return port_; }
  std::string LogTail() const { return process_.LogTail(); }
  // /api/v2/<endpoint>; the parsed answer or null.
  nlohmann::json Api(const std::string& endpoint) {
    auto r = HttpGet(port_, "/api/v2/" + endpoint);
    if (r.rc != 0) return nullptr;
    return nlohmann::json::parse(r.output, nullptr, false);
  }

 private:
  int port_;
  std::filesystem::path config_;
  ChildProcess process_;
  bool ready_ = false;
};

}  // namespace moeserve::test_support

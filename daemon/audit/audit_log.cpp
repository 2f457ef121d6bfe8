#include "moeserve/daemon/audit/audit_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "moeserve/common/durable_file.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"

namespace moeserve::daemon {

namespace {

Error IoError(const std::string& what, const std::string& path) {
  return Error::Io("audit log " + path + ": " + what + ": " + std::strerror(errno));
}

// Cuts a line torn by a crash (no newline at the end): it was never
// acknowledged, and a reader must not see half a record.
Status DropTornTail(int fd, const std::string& path, int64_t& size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Fail(IoError("stat", path));
  size = st.st_size;
  if (size == 0) return Ok();
  int64_t end = size;
  char c = 0;
  while (end > 0) {
    if (::pread(fd, &c, 1, end - 1) != 1) return Fail(IoError("read", path));
    if (c == '\n') break;
    --end;
  }
  if (end == size) return Ok();
  if (::ftruncate(fd, end) != 0 || ::fdatasync(fd) != 0) return Fail(IoError("truncate a torn last line", path));
  size = end;
  return Ok();
}

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double SteadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What rotation needs to know of a file before deleting it.
struct FileFacts {
  uint64_t lines = 0;
  double newest_authenticated = 0;  // unix seconds; 0: no authenticated line
};

// Lines are appended in about the order of their times (a line's time is
// taken as its request ends, just before it is queued), so the newest
// authenticated line is near the end of a file: it is read backwards and
// lines are parsed only until they are kOrderSlackSeconds older than the
// newest authenticated one found; the rest are only counted. A rotation so
// costs a read of the oldest file, not a parse of it. A line with a tenant
// whose time cannot be read counts as written when the file was last
// written: never older than it may be.
constexpr double kOrderSlackSeconds = 60;

Result<FileFacts> ScanFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::Io("audit log " + path + ": cannot be read"));
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return Fail(Error::Io("audit log " + path + ": cannot be read"));
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  const double written = ec ? WallNow()
                            : std::chrono::duration<double>(std::chrono::file_clock::to_sys(mtime).time_since_epoch()).count();
  FileFacts f;
  f.lines = static_cast<uint64_t>(std::count(bytes.begin(), bytes.end(), '\n'));
  for (size_t end = bytes.size(); end > 0;) {
    const size_t newline = end >= 2 ? bytes.rfind('\n', end - 2) : std::string::npos;
    const size_t start = newline == std::string::npos ? 0 : newline + 1;
    const nlohmann::json j = nlohmann::json::parse(bytes.begin() + static_cast<std::ptrdiff_t>(start),
                                                   bytes.begin() + static_cast<std::ptrdiff_t>(end), nullptr, false);
    end = start;
    if (!j.is_object()) continue;
    const double t = j.value("time", nlohmann::json()).is_string() ? ParseMicroTime(j["time"].get<std::string>()) : -1;
    if (j.value("tenant", nlohmann::json()).is_string()) f.newest_authenticated = std::max(f.newest_authenticated, t < 0 ? written : t);
    if (f.newest_authenticated > 0 && t >= 0 && t < f.newest_authenticated - kOrderSlackSeconds) break;
  }
  return f;
}

}  // namespace

Result<std::unique_ptr<AuditLog>> AuditLog::Open(AuditSettings settings) {
  std::error_code ec;
  std::filesystem::create_directories(settings.dir, ec);
  if (ec) return Fail(Error::Io("audit_dir " + settings.dir + ": " + ec.message()));
  std::unique_ptr<AuditLog> log(new AuditLog(std::move(settings)));
  const std::string path = log->Path(0);
  // Read and write: a torn last line is found (pread) and cut (ftruncate).
  log->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log->fd_ < 0) return Fail(IoError("open", path));
  MOE_TRY(DropTornTail(log->fd_, path, log->size_));
  MOE_TRY(FsyncPath(log->settings_.dir));  // the file's name survives a crash too
  log->audit_log_bytes_ = log->size_;
  MOE_TRY(log->LoadRetained());
  log->writer_ = std::thread([raw = log.get()] { raw->Run(); });
  return log;
}

AuditLog::~AuditLog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (fd_ >= 0) ::close(fd_);
}

std::string AuditLog::Path(int index) const {
  std::string p = (std::filesystem::path(settings_.dir) / "audit.log").string();
  return index == 0 ? p : p + "." + std::to_string(index);
}

void AuditLog::Append(std::string line, Done done, AuditLineKind kind, std::string tenant) {
  {
    std::lock_guard lock(mu_);
    if (kind != AuditLineKind::kRefusal || !stats_.full) {
      queue_.push_back(Queued{std::move(line), std::move(done), std::move(tenant)});
      cv_.notify_one();
      return;
    }
    // The room left is for the requests in flight; the refusal is counted.
    ++stats_.dropped_full;
  }
  if (done) done(Ok());
}

void AuditLog::AppendUnauthenticated(const std::function<std::string(uint64_t skipped)>& line) {
  uint64_t skipped;
  {
    std::lock_guard lock(mu_);
    ++stats_.unauthenticated_refusals;
    const double now = SteadyNow(), rate = settings_.unauthenticated_lines_per_second;
    if (rate <= 0 || now - last_sample_ < 1.0 / rate) {
      ++stats_.dropped_sampled;
      ++skipped_;
      return;
    }
    last_sample_ = now;
    skipped = skipped_;
    skipped_ = 0;
  }
  Append(line(skipped), nullptr, AuditLineKind::kRefusal);
}

bool AuditLog::full() const {
  std::lock_guard lock(mu_);
  // Past full_until_ the oldest file may go: admit again, and the next
  // batch's rotation finds out.
  return stats_.full && WallNow() < full_until_;
}

bool AuditLog::RefusesTenant(const std::string& tenant) const {
  std::lock_guard lock(mu_);
  const double now = WallNow();
  if (!stats_.full || now >= full_until_) return false;
  if (audit_log_bytes_.load() >= 2 * settings_.max_file_bytes) return true;  // the reserve is spent
  const double bound = static_cast<double>(settings_.max_file_bytes) * (settings_.max_files + 1);
  return static_cast<double>(RetainedLocked(tenant, now)) >= settings_.tenant_max_share * bound;
}

int64_t AuditLog::RetainedBytes(const std::string& tenant) const {
  std::lock_guard lock(mu_);
  return RetainedLocked(tenant, WallNow());
}

int64_t AuditLog::RetainedLocked(const std::string& tenant, double now) const {
  auto it = retained_.find(tenant);
  if (it == retained_.end()) return 0;
  const int64_t first = static_cast<int64_t>(std::floor((now - settings_.retention_hours * 3600) / 60));
  int64_t bytes = 0;
  for (auto m = it->second.lower_bound(first); m != it->second.end(); ++m) bytes += m->second;
  return bytes;
}

void AuditLog::CountRetained(const std::string& tenant, double time, int64_t bytes) {
  if (tenant.empty() || settings_.retention_hours <= 0) return;
  auto& minutes = retained_[tenant];
  minutes[static_cast<int64_t>(std::floor(time / 60))] += bytes;
  // Minutes past retention no longer hold the log: forget them.
  const int64_t first = static_cast<int64_t>(std::floor((WallNow() - settings_.retention_hours * 3600) / 60));
  minutes.erase(minutes.begin(), minutes.lower_bound(first));
}

Status AuditLog::LoadRetained() {
  if (settings_.retention_hours <= 0) return Ok();
  const double since = WallNow() - settings_.retention_hours * 3600;
  std::lock_guard lock(mu_);
  for (int i = settings_.max_files; i >= 0; --i) {
    const std::string path = Path(i);
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.value("tenant", nlohmann::json()).is_string()) continue;
      const double t = j.value("time", nlohmann::json()).is_string() ? ParseMicroTime(j["time"].get<std::string>()) : -1;
      if (t >= since) CountRetained(j["tenant"].get<std::string>(), t, static_cast<int64_t>(line.size()) + 1);
    }
    if (in.bad()) return Fail(Error::Io("audit log " + path + ": cannot be read"));
  }
  return Ok();
}

AuditStats AuditLog::stats() const {
  std::lock_guard lock(mu_);
  AuditStats s = stats_;
  s.reserve_spent = s.full && audit_log_bytes_.load() >= 2 * settings_.max_file_bytes;
  return s;
}

Status AuditLog::WriteBatch(const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A partial batch must not stay ahead of the next one: cut it back.
      const Error e = IoError("write", Path(0));
      if (::ftruncate(fd_, size_) != 0) { /* the torn tail is cut at the next Open */ }
      return Fail(e);
    }
    off += static_cast<size_t>(n);
  }
  if (::fdatasync(fd_) != 0) return Fail(IoError("fdatasync", Path(0)));
  size_ += static_cast<int64_t>(bytes.size());
  return Ok();
}

Status AuditLog::RotateIfFull() {
  if (size_ < settings_.max_file_bytes) return Ok();
  std::error_code ec;
  const std::string oldest = Path(settings_.max_files);
  if (std::filesystem::exists(oldest)) {
    {
      std::lock_guard lock(mu_);
      if (stats_.full && WallNow() < full_until_) return Ok();  // nothing has aged yet
    }
    MOE_ASSIGN_OR_RETURN(FileFacts facts, ScanFile(oldest));
    const double retention = settings_.retention_hours * 3600;
    if (retention > 0 && facts.newest_authenticated > 0 && facts.newest_authenticated + retention > WallNow()) {
      std::lock_guard lock(mu_);
      if (!stats_.full)
        log::Warn("audit log " + settings_.dir + " is full: " + oldest + " holds authenticated lines younger than "
                  "audit_retention_hours; new audited requests are refused (503 audit_log_full) for " +
                  std::to_string(static_cast<int64_t>(facts.newest_authenticated + retention - WallNow()) + 1) +
                  " s (raise audit_max_file_bytes or audit_max_files, or lower audit_retention_hours)");
      stats_.full = true;
      full_until_ = facts.newest_authenticated + retention;
      return Ok();
    }
    std::filesystem::remove(oldest, ec);
    if (ec) return Fail(Error::Io("audit log: deleting " + oldest + ": " + ec.message()));
    std::lock_guard lock(mu_);
    stats_.dropped_rotated += facts.lines;
  }
  for (int i = settings_.max_files - 1; i >= 1; --i) {
    if (std::filesystem::exists(Path(i))) std::filesystem::rename(Path(i), Path(i + 1), ec);
    if (ec) return Fail(Error::Io("audit log: rotating " + Path(i) + ": " + ec.message()));
  }
  std::filesystem::rename(Path(0), Path(1), ec);
  if (ec) return Fail(Error::Io("audit log: rotating " + Path(0) + ": " + ec.message()));
  const int fd = ::open(Path(0).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Fail(IoError("open", Path(0)));
  ::close(fd_);
  fd_ = fd;
  size_ = 0;
  audit_log_bytes_ = 0;
  {
    std::lock_guard lock(mu_);
    if (stats_.full) log::Info("audit log " + settings_.dir + " has room again: new audited requests are admitted");
    stats_.full = false;
  }
  return FsyncPath(settings_.dir);
}

void AuditLog::Run() {
  for (;;) {
    std::deque<Queued> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      batch.swap(queue_);
    }
    std::string bytes;
    for (const auto& q : batch) bytes += q.line + "\n";
    Status st = WriteBatch(bytes);
    {
      std::lock_guard lock(mu_);
      if (!st) {
        stats_.dropped_write_error += batch.size();
      } else {
        const double now = WallNow();
        for (const auto& q : batch) CountRetained(q.tenant, now, static_cast<int64_t>(q.line.size()) + 1);
      }
      audit_log_bytes_ = size_;
    }
    for (auto& q : batch)
      if (q.done) q.done(st);
    if (st) {
      if (Status r = RotateIfFull(); !r) {
        // Lines still go to the full file; the next batch tries again.
        log::Warn(r.error().ToString());
      }
    }
  }
}

Result<std::vector<nlohmann::json>> ReadAuditLog(const std::string& dir, const AuditFilter& filter) {
  double since = 0;
  if (!filter.since.empty()) {
    since = ParseMicroTime(filter.since);
    if (since < 0) return Fail(Error::InvalidArgument("since: not an RFC 3339 time (2026-12-05T06:00:00Z): '" + filter.since + "'"));
  }
  // audit.log.N is the oldest: read from the highest index down to audit.log.
  std::vector<std::string> files;
  for (int i = 1;; ++i) {
    const std::string p = (std::filesystem::path(dir) / ("audit.log." + std::to_string(i))).string();
    if (!std::filesystem::exists(p)) break;
    files.push_back(p);
  }
  std::reverse(files.begin(), files.end());
  files.push_back((std::filesystem::path(dir) / "audit.log").string());
  std::deque<nlohmann::json> out;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;  // rotated away between the listing and now
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // no newline yet: a batch being written
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      if (!filter.tenant.empty() && j.value("tenant", "") != filter.tenant) continue;
      if (since > 0 && ParseMicroTime(j.value("time", "")) < since) continue;
      out.push_back(std::move(j));
      if (out.size() > filter.limit) out.pop_front();
    }
  }
  return std::vector<nlohmann::json>(std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
}

}  // namespace moeserve::daemon

// WeightPuller::Pull, in steps:
//   1. take the per-model pull lock (another process pulling the same model: wait);
//   2. reuse the cached model when it is complete, was verified if the request
//      needs that, and passes CheckCachedModel (no planted links);
//   3. fetch manifest.json (or list the source with --no-verify), and refuse
//      any path that would leave the model's folder;
//   4. make room (LRU eviction under the size limit) and check free space;
//   5. open or create the resume record in partial/<key>;
//   6. download the missing byte ranges with N workers, verifying each file
//      when its last part lands (a sha256 mismatch refetches the file once);
//   7. fsync, rename into models/<key>, take a lease.
#include "moeserve/storage/weight_puller.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/nofollow.hpp"
#include "moeserve/storage/object_key.hpp"
#include "moeserve/storage/pull_metrics.hpp"
#include "cached_model.hpp"
#include "resume_record.hpp"

namespace moeserve::storage {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn (one transfer attempt) until it succeeds, fails for good, or
// exhausts the policy. progress() reports bytes moved so far; an attempt that
// moved bytes resets the failure count.
template <class Fn, class ProgressFn>
Status WithRetries(const RetryPolicy& policy, ObjectConnection& conn, std::mt19937_64& rng,
                   const std::atomic<bool>& abort, const std::string& what, Fn fn, ProgressFn progress) {
  int failures = 0;
  for (;;) {
    uint64_t before = progress();
    Status s = fn();
    if (s) return Ok();
    if (!IsRetryable(s.error()) || abort.load()) return s;
    if (progress() > before) failures = 0;
    ++failures;
    if (failures >= policy.max_attempts)
      return Fail(s.error().WithContext(what + ": giving up after " + std::to_string(failures) + " attempts"));
    auto delay = policy.Delay(failures, conn.RetryAfter(), rng);
    log::Warn(what + ": " + s.error().message() + "; retrying in " + std::to_string(delay.count()) + " ms");
    auto until = Clock::now() + delay;
    while (Clock::now() < until && !abort.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct OpenFile {
  std::atomic<size_t> parts_left{0};
  std::atomic<int> refetches{0};
};

// Files are opened per task rather than all at once, so a checkpoint of
// thousands of shards stays within the process's descriptor limit; each open
// walks from partial/<key>'s descriptor without following links.
class Download {
 public:
  Download(ObjectSource& source, const engine::Manifest& manifest, ResumeRecord& record, int dir_fd,
           const std::string& dir, const PullOptions& options, PullStatus& status)
      : source_(source), manifest_(manifest), record_(record), dir_fd_(dir_fd), dir_(dir), options_(options),
        status_(status), files_(manifest.files.size()) {}


  Status Run(PullStats& stats) {
    MOE_TRY(OpenFiles());
    // Queue every unfinished part; files already complete go straight to verification.
    for (size_t p = 0; p < record_.parts().size(); ++p) {
      if (record_.Done(p) < record_.parts()[p].length) {
        files_[record_.parts()[p].file].parts_left++;
        tasks_.push_back({false, p});
      }
    }
    for (size_t f = 0; f < files_.size(); ++f)
      if (files_[f].parts_left == 0) tasks_.push_back({true, f});
    stats.bytes_resumed = record_.TotalDone();

    int n = std::max(1, options_.connections);
    std::vector<std::thread> workers;
    for (int i = 0; i < n; ++i) workers.emplace_back([this, i] { Work(i); });
    for (auto& w : workers) w.join();
    stats.files_refetched = refetched_.load();
    if (first_error_) return Fail(*first_error_);
    return Ok();
  }

 private:
  struct Task {
    bool verify;   // false: download part `index`; true: verify file `index`
    size_t index;
  };

  Status OpenFiles() {
    for (size_t f = 0; f < manifest_.files.size(); ++f) {
      std::string path = dir_ + "/" + manifest_.files[f].path;
      auto opened = OpenFileAt(dir_fd_, manifest_.files[f].path, O_RDWR | O_CREAT, dir_);
      if (!opened) return Fail(opened.error().WithContext("cache"));
      int fd = opened->get();
      struct stat st{};
      ::fstat(fd, &st);
      if (static_cast<uint64_t>(st.st_size) != manifest_.files[f].size &&
          ::ftruncate(fd, static_cast<off_t>(manifest_.files[f].size)) != 0)
        return Fail(Error::Io("cache: sizing '" + path + "': " + std::strerror(errno)));
    }
    return Ok();
  }

  void Work(int worker) {
    auto conn = source_.Connect();
    std::mt19937_64 rng(std::random_device{}() + static_cast<uint64_t>(worker));
    for (;;) {
      Task task;
      {
        std::lock_guard lock(mu_);
        if (tasks_.empty() || abort_) return;
        task = tasks_.front();
        tasks_.pop_front();
      }
      Status s = task.verify ? VerifyFile(task.index, *conn, rng) : FetchPart(task.index, *conn, rng);
      if (s && !task.verify) {
        size_t f = record_.parts()[task.index].file;
        if (--files_[f].parts_left == 0) s = VerifyFile(f, *conn, rng);
      }
      if (!s) {
        std::lock_guard lock(mu_);
        if (!first_error_) first_error_ = s.error();
        abort_ = true;
        return;
      }
    }
  }

  Status FetchPart(size_t p, ObjectConnection& conn, std::mt19937_64& rng) {
    const PartSpan& part = record_.parts()[p];
    const engine::ManifestEntry& file = manifest_.files[part.file];
    MOE_ASSIGN_OR_RETURN(UniqueFd file_fd, Open(part.file));
    int fd = file_fd.get();
    auto attempt = [&]() -> Status {
      uint64_t done = record_.Done(p);
      if (done >= part.length) return Ok();
      uint64_t pos = part.offset + done;
      // After another part failed for good, transfers in flight still run to
      // their end (and are recorded): aborting them would throw away bytes the
      // network already carried, which the next pull would fetch again.
      auto got = conn.Get(file.path, pos, part.length - done, [&](const char* data, size_t n) -> Status {
        size_t written = 0;
        while (written < n) {
          ssize_t w = ::pwrite(fd, data + written, n - written, static_cast<off_t>(pos + written));
          if (w < 0) {
            if (errno == EINTR) continue;
            return Fail(Error::Io("cache: writing '" + file.path + "': " + std::strerror(errno)));
          }
          written += static_cast<size_t>(w);
        }
        pos += n;
        status_.AddDone(n);
        status_.AddFetched(n);
        GlobalPullMetrics().bytes_pulled_total.fetch_add(n, std::memory_order_relaxed);
        fetched_.fetch_add(n, std::memory_order_relaxed);
        return record_.SetDone(p, pos - part.offset);  // after the data: never counts unwritten bytes
      });
      if (!got) return Fail(got.error());
      return Ok();
    };
    return WithRetries(options_.retry, conn, rng, abort_, source_.Describe(file.path), attempt,
                       [&] { return record_.Done(p); });
  }

  Status VerifyFile(size_t f, ObjectConnection& conn, std::mt19937_64& rng) {
    const engine::ManifestEntry& file = manifest_.files[f];
    if (!options_.verify || file.sha256.empty()) return FsyncFile(f);
    MOE_ASSIGN_OR_RETURN(std::string digest, HashFile(f));
    if (digest == file.sha256) return FsyncFile(f);
    std::string mismatch = "sha256 mismatch: manifest says " + file.sha256 + ", downloaded bytes hash to " + digest;
    if (files_[f].refetches.fetch_add(1) >= 1)
      return Fail(Error::Corruption(source_.Describe(file.path), mismatch + " again after fetching it a second time; "
                                                                    "the stored object does not match manifest.json"));
    // Maybe a bad transfer: forget this file's bytes and fetch it once more, here.
    log::Warn(source_.Describe(file.path) + ": " + mismatch + "; fetching the file again");
    refetched_.fetch_add(1);
    for (size_t p = 0; p < record_.parts().size(); ++p) {
      if (record_.parts()[p].file != f) continue;
      status_.SubDone(record_.Done(p));
      MOE_TRY(record_.SetDone(p, 0));
    }
    for (size_t p = 0; p < record_.parts().size(); ++p)
      if (record_.parts()[p].file == f) MOE_TRY(FetchPart(p, conn, rng));
    return VerifyFile(f, conn, rng);
  }

  Result<UniqueFd> Open(size_t f) {
    auto opened = OpenFileAt(dir_fd_, manifest_.files[f].path, O_RDWR, dir_);
    if (!opened) return Fail(opened.error().WithContext("cache"));
    return std::move(*opened);
  }

  Result<std::string> HashFile(size_t f) {
    MOE_ASSIGN_OR_RETURN(UniqueFd file, Open(f));
    Sha256 h;
    std::vector<char> buf(1 << 20);
    uint64_t off = 0, size = manifest_.files[f].size;
    while (off < size) {
      ssize_t n = ::pread(file.get(), buf.data(), static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off)),
                          static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Fail(Error::Io("cache: reading back '" + manifest_.files[f].path + "' to verify it"));
      h.Update(buf.data(), static_cast<size_t>(n));
      off += static_cast<uint64_t>(n);
    }
    return h.HexDigest();
  }

  Status FsyncFile(size_t f) {
    MOE_ASSIGN_OR_RETURN(UniqueFd file, Open(f));
    if (::fsync(file.get()) != 0)
      return Fail(Error::Io("cache: fsync '" + manifest_.files[f].path + "': " + std::strerror(errno)));
    return Ok();
  }

  ObjectSource& source_;
  const engine::Manifest& manifest_;
  ResumeRecord& record_;
  int dir_fd_;  // partial/<key>
  std::string dir_;
  const PullOptions& options_;
  PullStatus& status_;
  std::vector<OpenFile> files_;
  std::mutex mu_;
  std::deque<Task> tasks_;
  std::optional<Error> first_error_;
  std::atomic<bool> abort_{false};
  std::atomic<uint64_t> fetched_{0};
  std::atomic<int> refetched_{0};
};

// Logs and calls on_progress on a timer while a pull downloads.
class ProgressReporter {
 public:
  ProgressReporter(const PullOptions& options, PullStatus& status) : options_(options), status_(status) {
    if (!options_.log_progress && !options_.on_progress) return;
    thread_ = std::thread([this] {
      std::unique_lock lock(mu_);
      auto last_log = Clock::now();
      while (!stop_) {
        cv_.wait_for(lock, options_.progress_interval);
        if (stop_) break;
        PullProgress p = status_.Snapshot();
        if (options_.on_progress) options_.on_progress(p);
        // Log lines at most every 5 s, so that a long pull does not flood the log.
        if (options_.log_progress && Clock::now() - last_log >= std::chrono::seconds(5)) {
          log::Info(p.ToLogLine());
          last_log = Clock::now();
        }
      }
    });
  }
  ~ProgressReporter() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (options_.on_progress) options_.on_progress(status_.Snapshot());
  }

 private:
  const PullOptions& options_;
  PullStatus& status_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

Result<std::pair<engine::Manifest, std::string>> LoadManifest(ObjectSource& source, const PullOptions& options,
                                                              PullStats& stats) {
  auto conn = source.Connect();
  std::mt19937_64 rng(std::random_device{}());
  std::atomic<bool> no_abort{false};
  std::string text;
  uint64_t got = 0;
  Status s = WithRetries(
      options.retry, *conn, rng, no_abort, source.Describe("manifest.json"),
      [&]() -> Status {
        auto r = ReadWholeObject(*conn, "manifest.json");
        if (!r) return Fail(r.error());
        text = std::move(*r);
        got = text.size();
        return Ok();
      },
      [&] { return got; });
  stats.bytes_fetched += text.size();
  if (s) {
    MOE_ASSIGN_OR_RETURN(engine::Manifest m, engine::ParseManifest(text, source.Describe("manifest.json")));
    MOE_TRY(CheckManifestPaths(m, source.Describe("manifest.json")));
    return std::pair{std::move(m), text};
  }
  if (s.error().code() != ErrorCode::kNotFound) return Fail(s.error());
  if (options.verify)
    return Fail(Error::NotFound(source.Describe("manifest.json") +
                                " does not exist: the pull cannot verify the model (pass --no-verify to pull it unverified)"));
  // Unverified pull: the listing says what to fetch; sizes from the listing, no hashes.
  log::Warn(source.Describe("") + ": no manifest.json; pulling every listed object WITHOUT verification");
  MOE_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, source.List());
  if (objects.empty()) return Fail(Error::NotFound(source.Describe("") + ": no objects to pull"));
  engine::Manifest m;
  for (auto& o : objects) m.files.push_back({o.key, o.size, ""});
  MOE_TRY(CheckManifestPaths(m, "listing of " + source.Describe("")));
  return std::pair{std::move(m), std::string()};
}

// Step 2: the complete model under key, leased, when it may serve this
// request; nullopt when there is none. Every reuse first passes
// CheckCachedModel. A verified request takes a model recorded as verified; one
// that is not (a puller that did not record the flag, or an altered meta file)
// is hashed again against its manifest.json and, if that fails, evicted so
// that the caller pulls it afresh; that only under key's own pull lock
// (holds_pull_lock), otherwise such a model is passed over.
Result<std::optional<PulledModel>> ReuseCached(const ModelCache& cache, const std::string& key, bool need_verified,
                                               bool rehash, bool holds_pull_lock) {
  MOE_ASSIGN_OR_RETURN(bool present, cache.FindModel(key));
  if (!present) return std::nullopt;
  auto lease = cache.Lease(key);
  if (!lease) {
    if (lease.error().code() == ErrorCode::kNotFound) return std::nullopt;  // evicted meanwhile
    return Fail(lease.error());
  }
  auto meta = cache.ReadMeta(key);
  if (!meta)
    return Fail(meta.error().WithContext("cache: nothing records how " + cache.ModelPath(key) +
                                         " was pulled, so it is not reused (remove it to pull again)"));
  const bool reverify = need_verified && !meta->verified;
  if (reverify && !holds_pull_lock) return std::nullopt;
  Status checked = CheckCachedModel(cache, key, meta->verified || reverify, rehash || reverify);
  if (!checked) {
    if (!reverify) return Fail(checked.error());
    log::Warn(cache.ModelPath(key) + " is not recorded as verified and does not verify (" +
              checked.error().message() + "); evicting it to pull afresh");
    lease->Release();
    MOE_ASSIGN_OR_RETURN(bool evicted, cache.TryEvictWhilePulling(key));
    if (!evicted)
      return Fail(checked.error().WithContext("cache: " + cache.ModelPath(key) +
                                              " does not verify and another process uses it"));
    return std::nullopt;
  }
  if (reverify) {
    meta->verified = true;
    MOE_TRY(cache.WriteMeta(key, *meta));
    log::Info("cache: " + cache.ModelPath(key) + " verified again against its manifest.json");
  }
  PulledModel out;
  out.dir = cache.ModelPath(key);
  out.lease = std::move(*lease);
  out.stats.reused = true;
  out.stats.bytes_total = meta->bytes;
  return std::optional<PulledModel>(std::move(out));
}

}  // namespace

Result<PulledModel> WeightPuller::Pull(const std::string& uri_text, const PullOptions& options,
                                       PullStatus* status_in) const {
  PullStatus local_status;
  PullStatus& status = status_in ? *status_in : local_status;
  status.Begin(uri_text, options.revision);
  auto started = Clock::now();
  PullMetrics& metrics = GlobalPullMetrics();

  auto run = [&]() -> Result<PulledModel> {
    MOE_ASSIGN_OR_RETURN(SourceUri uri, ParseSourceUri(uri_text));
    MOE_ASSIGN_OR_RETURN(ModelCache cache, ModelCache::Open(cache_config_));
    std::string key = ModelCache::Key(uri.original, options.revision, options.verify);
    PulledModel out;
    out.dir = cache.ModelPath(key);

    // 1-2. One puller per model per node; the others wait, then reuse its result.
    status.SetState(PullState::kWaitingForLock);
    MOE_ASSIGN_OR_RETURN(FileLock pull_lock, cache.LockForPull(key));
    MOE_ASSIGN_OR_RETURN(auto reused, ReuseCached(cache, key, options.verify, options.reverify_cached, true));
    if (!reused && !options.verify) {
      // A verified copy serves an unverified request as well.
      std::string verified_key = ModelCache::Key(uri.original, options.revision, true);
      MOE_ASSIGN_OR_RETURN(reused, ReuseCached(cache, verified_key, true, options.reverify_cached, false));
    }
    if (reused) return std::move(*reused);

    // 3. What to fetch.
    status.SetState(PullState::kFetchingManifest);
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<ObjectSource> source, OpenObjectSource(uri, options.source));
    MOE_ASSIGN_OR_RETURN(auto loaded, LoadManifest(*source, options, out.stats));
    auto& [manifest, manifest_text] = loaded;
    uint64_t total = 0;
    for (const auto& f : manifest.files) total += f.size;
    out.stats.bytes_total = total;

    // 4-5. Room for it, then the resume record (whatever is already on disk counts).
    MOE_TRY(cache.MakeRoom(total, key));
    if (options.part_size == 0) return Fail(Error::InvalidArgument("part size must be positive"));
    MOE_ASSIGN_OR_RETURN(UniqueFd partial, cache.OpenPartial(key));
    MOE_ASSIGN_OR_RETURN(auto record, ResumeRecord::OpenOrCreate(partial.get(), cache.PartialPath(key), manifest,
                                                                  Sha256Hex(manifest_text), options.part_size));
    uint64_t present = record->TotalDone();
    MOE_TRY(cache.CheckFreeSpace(total - present + (1 << 20)));
    if (present > 0)
      log::Info("pull " + uri.original + ": resuming with " + FormatBytes(static_cast<double>(present)) + " of " +
                FormatBytes(static_cast<double>(total)) + " already in " + cache.PartialPath(key));
    status.SetTotal(total, present);

    // 6. Download and verify.
    status.SetState(PullState::kDownloading);
    {
      ProgressReporter reporter(options, status);
      Download download(*source, manifest, *record, partial.get(), cache.PartialPath(key), options, status);
      uint64_t fetched_before = status.Snapshot().bytes_fetched;
      Status s = download.Run(out.stats);
      out.stats.bytes_fetched += status.Snapshot().bytes_fetched - fetched_before;
      MOE_TRY(s);
    }

    // 7. Publish atomically: manifest.json beside the files, state folder gone.
    status.SetState(PullState::kVerifying);
    if (!manifest_text.empty())
      MOE_TRY(WriteFileAt(partial.get(), "manifest.json", manifest_text, cache.PartialPath(key)));
    MOE_TRY(record->Remove());
    MOE_TRY(cache.Publish(key, {uri.original, options.revision, total, options.verify}));
    MOE_ASSIGN_OR_RETURN(out.lease, cache.Lease(key));
    return out;
  };

  Result<PulledModel> result = run();
  double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (!result) {
    metrics.pulls_failed.fetch_add(1);
    Error e = result.error().WithContext("pull " + uri_text + " (revision " + options.revision + ")");
    status.Fail(e.message());
    return Fail(e);
  }
  result->stats.seconds = seconds;
  if (result->stats.reused) {
    metrics.pulls_reused.fetch_add(1);
  } else {
    metrics.pulls_succeeded.fetch_add(1);
    metrics.ObserveDuration(seconds);
  }
  status.SetTotal(result->stats.bytes_total, result->stats.bytes_total);
  status.SetState(PullState::kReady);
  return result;
}

}  // namespace moeserve::storage

// PublishModel: scan and hash the directory, send each file (skipping those
// already at the target, resuming half-sent multipart uploads), then the manifest.
#include "moeserve/storage/model_publisher.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"
#include "moeserve/storage/object_key.hpp"
#include "moeserve/storage/source_uri.hpp"
#include "s3_uploader.hpp"

namespace moeserve::storage {
namespace {

namespace fs = std::filesystem;

bool IsUnder(const fs::path& p, const fs::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

Status WriteFileAtomically(const fs::path& path, std::string_view data) {
  fs::path tmp = path;
  tmp += ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out.flush()) return Fail(Error::Io(tmp.string() + ": cannot write"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Fail(Error::Io(path.string() + ": cannot rename into place: " + ec.message()));
  return Ok();
}

std::string DefaultStateDir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/moeserve/publish";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/moeserve/publish";
  return (fs::temp_directory_path() / "moeserve-publish").string();
}

// The resume record of one multipart upload: which file (size, sha256) it
// carries, in which part size, and each finished part's ETag and sha256.
struct UploadState {
  std::string upload_id;
  uint64_t size = 0;
  std::string sha256;
  uint64_t part_size = 0;
  struct Part {
    std::string etag;
    std::string sha256;
  };
  std::map<int, Part> parts;

  std::string ToJson() const {
    nlohmann::json j{{"upload_id", upload_id}, {"size", size}, {"sha256", sha256}, {"part_size", part_size}};
    j["parts"] = nlohmann::json::array();
    for (const auto& [n, p] : parts) j["parts"].push_back({{"number", n}, {"etag", p.etag}, {"sha256", p.sha256}});
    return j.dump();
  }
  // nullopt for a missing or unreadable record (the upload then starts afresh).
  static std::optional<UploadState> Load(const fs::path& path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
    try {
      UploadState s;
      s.upload_id = j.at("upload_id").get<std::string>();
      s.size = j.at("size").get<uint64_t>();
      s.sha256 = j.at("sha256").get<std::string>();
      s.part_size = j.at("part_size").get<uint64_t>();
      for (const auto& p : j.at("parts"))
        s.parts[p.at("number").get<int>()] = {p.at("etag").get<std::string>(), p.at("sha256").get<std::string>()};
      return s;
    } catch (const nlohmann::json::exception&) {
      return std::nullopt;
    }
  }
};

class S3Publisher {
 public:
  S3Publisher(S3Uploader& up, std::string prefix, const PublishOptions& o, fs::path state_dir, PublishStats& stats)
      : up_(up), prefix_(std::move(prefix)), o_(o), state_dir_(std::move(state_dir)), stats_(stats) {}

  Status Send(const fs::path& file, const engine::ManifestEntry& e) {
    std::string key = prefix_ + e.path;
    fs::path state_path = state_dir_ / (Sha256Hex(up_.Describe(key)) + ".json");
    MOE_ASSIGN_OR_RETURN(auto head, up_.Head(key));
    if (head && head->size == e.size && head->sha256 == e.sha256) {
      ++stats_.files_skipped;
      std::error_code ec;
      fs::remove(state_path, ec);
      if (o_.log_progress) log::Info("publish: " + up_.Describe(key) + " is already there");
      return Ok();
    }
    ++stats_.files_sent;
    if (e.size <= o_.multipart_threshold) {
      if (o_.log_progress) log::Info("publish: " + e.path + " -> " + up_.Describe(key));
      MOE_TRY(up_.PutFile(key, file.string(), e.size, e.sha256));
      stats_.bytes_sent += e.size;
      return Ok();
    }
    return SendInParts(file, e, key, state_path);
  }

 private:
  // Best effort: a server that cannot abort keeps the parts until its
  // lifecycle rule for incomplete multipart uploads removes them.
  void DropUpload(const std::string& key, const std::string& upload_id) {
    if (auto a = up_.AbortMultipartUpload(key, upload_id); !a)
      log::Warn("publish: could not abort the stale upload of " + up_.Describe(key) + ": " + a.error().message());
  }

  Status SaveState(const fs::path& path, const UploadState& s) { return WriteFileAtomically(path, s.ToJson()); }

  Status SendInParts(const fs::path& file, const engine::ManifestEntry& e, const std::string& key,
                     const fs::path& state_path) {
    const uint64_t part_size = PlanPartSize(e.size, o_.part_size, o_.allow_small_parts);
    std::optional<UploadState> state = UploadState::Load(state_path);
    if (state && (state->size != e.size || state->sha256 != e.sha256 || state->part_size != part_size)) {
      log::Warn("publish: " + e.path + " changed since its interrupted upload; starting it afresh");
      DropUpload(key, state->upload_id);
      ++stats_.uploads_restarted;
      state.reset();
    }
    for (int round = 0; round < 2; ++round) {
      if (!state) {
        MOE_ASSIGN_OR_RETURN(std::string id, up_.CreateMultipartUpload(key, e.sha256));
        state = UploadState{id, e.size, e.sha256, part_size, {}};
        MOE_TRY(SaveState(state_path, *state));
      }
      auto sent = SendParts(file, e, key, state_path, *state);
      if (sent) break;
      // The server forgot the upload (expired, aborted elsewhere), or a part kept
      // on record no longer matches the file: start over once.
      bool stale = sent.error().code() == ErrorCode::kNotFound || sent.error().code() == ErrorCode::kConflict;
      if (!stale || round == 1) return Fail(sent.error());
      log::Warn("publish: " + e.path + ": " + sent.error().message() + "; starting its upload afresh");
      DropUpload(key, state->upload_id);
      ++stats_.uploads_restarted;
      state.reset();
    }
    std::vector<S3CompletedPart> parts;
    for (const auto& [n, p] : state->parts) parts.push_back({n, p.etag});
    MOE_TRY(up_.CompleteMultipartUpload(key, state->upload_id, parts));
    std::error_code ec;
    fs::remove(state_path, ec);
    return Ok();
  }

  // Sends the parts the record lacks; the parts it has are read and checked
  // (sha256) so that the whole file's hash is confirmed against the manifest.
  Status SendParts(const fs::path& file, const engine::ManifestEntry& e, const std::string& key,
                   const fs::path& state_path, UploadState& state) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(Error::Io(file.string() + ": cannot open"));
    Sha256 whole;
    std::string buf;
    const int count = static_cast<int>((e.size + state.part_size - 1) / state.part_size);
    for (int n = 1; n <= count; ++n) {
      uint64_t len = std::min<uint64_t>(state.part_size, e.size - static_cast<uint64_t>(n - 1) * state.part_size);
      buf.resize(len);
      if (!in.read(buf.data(), static_cast<std::streamsize>(len)))
        return Fail(Error::Io(file.string() + ": shorter than when it was hashed (changed while publishing?)"));
      whole.Update(buf.data(), len);
      std::string part_sha = Sha256Hex(buf);
      if (auto it = state.parts.find(n); it != state.parts.end()) {
        if (it->second.sha256 != part_sha)
          return Fail(Error::Conflict(e.path + ": part " + std::to_string(n) + " differs from the one already sent"));
        ++stats_.parts_resumed;
        continue;
      }
      MOE_ASSIGN_OR_RETURN(std::string etag, up_.UploadPart(key, state.upload_id, n, buf));
      state.parts[n] = {etag, part_sha};
      MOE_TRY(SaveState(state_path, state));
      ++stats_.parts_sent;
      stats_.bytes_sent += len;
      if (o_.log_progress)
        log::Info("publish: " + e.path + " part " + std::to_string(n) + "/" + std::to_string(count) + " sent");
      if (o_.after_part) MOE_TRY(o_.after_part(e.path, n));
    }
    if (whole.HexDigest() != e.sha256)
      return Fail(Error::Corruption(file.string(), "changed while publishing: its sha256 no longer matches the manifest"));
    return Ok();
  }

  S3Uploader& up_;
  std::string prefix_;
  const PublishOptions& o_;
  fs::path state_dir_;
  PublishStats& stats_;
};

Status CopyToLocal(const fs::path& src, const fs::path& dest, const engine::ManifestEntry& e, PublishStats& stats) {
  std::error_code ec;
  if (fs::is_regular_file(dest, ec) && fs::file_size(dest, ec) == e.size) {
    auto sha = Sha256File(dest.string());
    if (sha && *sha == e.sha256) {
      ++stats.files_skipped;
      return Ok();
    }
  }
  fs::create_directories(dest.parent_path(), ec);
  if (ec) return Fail(Error::Io(dest.parent_path().string() + ": cannot create: " + ec.message()));
  fs::path tmp = dest;
  tmp += ".partial";
  fs::copy_file(src, tmp, fs::copy_options::overwrite_existing, ec);
  if (ec) return Fail(Error::Io(src.string() + " -> " + tmp.string() + ": " + ec.message()));
  auto sha = Sha256File(tmp.string());
  if (!sha) return Fail(sha.error());
  if (*sha != e.sha256)
    return Fail(Error::Corruption(src.string(), "changed while publishing: its sha256 no longer matches the manifest"));
  fs::rename(tmp, dest, ec);
  if (ec) return Fail(Error::Io(dest.string() + ": " + ec.message()));
  ++stats.files_sent;
  stats.bytes_sent += e.size;
  return Ok();
}

}  // namespace

uint64_t PlanPartSize(uint64_t size, uint64_t requested, bool allow_small_parts) {
  uint64_t part = std::max<uint64_t>(requested, (size + kS3MaxParts - 1) / kS3MaxParts);
  if (!allow_small_parts) part = std::max(part, kS3MinPartSize);
  return part;
}

Result<engine::Manifest> ManifestForPublish(const std::string& dir_in, bool follow_symlinks) {
  std::error_code ec;
  if (!fs::is_directory(dir_in, ec)) return Fail(Error::NotFound(dir_in + ": not a directory"));
  fs::path dir = fs::canonical(dir_in, ec);
  if (ec) return Fail(Error::Io(dir_in + ": " + ec.message()));
  // Names come from the walk itself (lexically): fs::relative would resolve a
  // symlink and list the file under its target's name.
  std::vector<std::pair<std::string, fs::path>> files;  // object key, file on disk
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string rel = it->path().lexically_relative(dir).generic_string();
    auto st = it->symlink_status(ec);
    if (ec) return Fail(Error::Io(it->path().string() + ": " + ec.message()));
    if (fs::is_symlink(st)) {
      fs::path target = fs::canonical(it->path(), ec);
      if (ec) return Fail(Error::NotFound(it->path().string() + ": a symlink to nothing (" + ec.message() + ")"));
      if (fs::is_directory(target))
        return Fail(Error::InvalidArgument(it->path().string() + ": a symlinked folder; copy it in instead"));
      if (!IsUnder(target, dir) && !follow_symlinks)
        return Fail(Error::InvalidArgument(it->path().string() + ": a symlink leaving the directory (to " +
                                           target.string() + "); pass --follow-symlinks to publish what it "
                                           "points at (a Hugging Face cache snapshot)"));
      if (!fs::is_regular_file(target))
        return Fail(Error::InvalidArgument(it->path().string() + ": a symlink to something that is not a file"));
    } else if (fs::is_directory(st)) {
      continue;
    } else if (!fs::is_regular_file(st)) {
      return Fail(Error::InvalidArgument(it->path().string() + ": not a regular file (a fifo, socket or device)"));
    }
    if (rel == "manifest.json") continue;  // written afresh
    if (auto k = CheckObjectKey(rel); !k) return Fail(k.error().WithContext(dir.string()));
    if (::access(it->path().c_str(), R_OK) != 0) return Fail(Error::PermissionDenied(it->path().string() + ": unreadable"));
    files.emplace_back(rel, it->path());
  }
  if (ec) return Fail(Error::Io(dir.string() + ": cannot list: " + ec.message()));
  engine::Manifest m;
  for (const auto& [rel, path] : files) {
    engine::ManifestEntry f{rel, fs::file_size(path, ec), ""};  // follows a permitted symlink
    if (ec) return Fail(Error::Io(path.string() + ": " + ec.message()));
    MOE_ASSIGN_OR_RETURN(f.sha256, Sha256File(path.string()));
    m.files.push_back(std::move(f));
  }
  std::sort(m.files.begin(), m.files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  if (m.files.empty()) return Fail(Error::InvalidArgument(dir.string() + ": no files to publish"));
  MOE_TRY(CheckManifestPaths(m, dir.string()));
  return m;
}

Result<PublishResult> PublishModel(const std::string& dir, const std::string& target_uri,
                                   const PublishOptions& options) {
  MOE_ASSIGN_OR_RETURN(SourceUri uri, ParseSourceUri(target_uri));
  if (uri.kind == SourceUri::Kind::kHttp)
    return Fail(Error::InvalidArgument(target_uri + ": publish writes to s3:// or file:// targets"));
  if (options.part_size == 0) return Fail(Error::InvalidArgument("the part size must be positive"));
  PublishResult result;
  if (options.log_progress) log::Info("publish: hashing " + dir);
  MOE_ASSIGN_OR_RETURN(result.manifest, ManifestForPublish(dir, options.follow_symlinks));
  result.stats.files = static_cast<int>(result.manifest.files.size());
  const std::string manifest_json = result.manifest.ToJson();
  result.manifest_sha256 = Sha256Hex(manifest_json);
  if (options.write_local_manifest) {
    if (auto w = WriteFileAtomically(fs::path(dir) / "manifest.json", manifest_json); !w)
      log::Warn("publish: " + w.error().message() + " (the manifest still goes to the target)");
  }

  if (uri.kind == SourceUri::Kind::kFile) {
    for (const auto& e : result.manifest.files)
      MOE_TRY(CopyToLocal(fs::path(dir) / e.path, fs::path(uri.path) / e.path, e, result.stats));
    MOE_TRY(WriteFileAtomically(fs::path(uri.path) / "manifest.json", manifest_json));
    return result;
  }

  const SourceOptions& t = options.target;
  MOE_ASSIGN_OR_RETURN(S3Endpoint endpoint, MakeS3Endpoint(t.endpoint_url, t.region, t.addressing));
  AwsCredentials credentials;
  if (t.credentials) {
    credentials = *t.credentials;
  } else {
    MOE_ASSIGN_OR_RETURN(credentials, LoadAwsCredentials(t.credentials_file));
  }
  fs::path state_dir = options.state_dir.empty() ? DefaultStateDir() : options.state_dir;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return Fail(Error::Io(state_dir.string() + ": cannot create the resume-state folder: " + ec.message()));

  S3Uploader up(endpoint, credentials, uri.bucket, t.ca_file, options.retry);
  MOE_TRY(up.CheckBucket(uri.prefix + "manifest.json"));
  S3Publisher publisher(up, uri.prefix, options, state_dir, result.stats);
  for (const auto& e : result.manifest.files) MOE_TRY(publisher.Send(fs::path(dir) / e.path, e));
  MOE_TRY(up.PutBytes(uri.prefix + "manifest.json", manifest_json, "application/json"));
  if (options.log_progress) log::Info("publish: " + up.Describe(uri.prefix + "manifest.json") + " written last");
  return result;
}

}  // namespace moeserve::storage

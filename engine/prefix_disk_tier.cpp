#include "prefix_disk_tier.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moeserve/common/log.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::engine {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'P', 'F', 'X', 'C', '1'};
constexpr const char* kSuffix = ".mpc";
constexpr size_t kDigestBytes = 32;
// Caps on a header's lengths, checked before anything is sized from them.
constexpr uint32_t kMaxPartitionBytes = 1 << 16;
constexpr uint64_t kMaxTokens = uint64_t{1} << 31;
constexpr uint32_t kMaxLayers = 1 << 12;
// magic, version, block_tokens, floats_per_token, model id, is_public,
// partition bytes, tokens, delta layers.
constexpr size_t kFixedHeader = 8 + 4 + 4 + 8 + 16 + 1 + 4 + 8 + 4;

uint64_t Mix(uint64_t h, uint64_t v) {  // splitmix64 over the running hash
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Appends fixed-width little-endian fields (this code runs on little-endian
// hosts only: x86-64 and aarch64).
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <class T>
  void Put(T v) {
    Bytes(&v, sizeof v);
  }

 private:
  std::vector<uint8_t>& out_;
};

// Reads fields from a buffer; every read is bounds-checked (ok() false after
// the first read past the end).
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool Bytes(void* dst, size_t n) {
    if (!ok_ || n > n_ - at_) return ok_ = false;
    std::memcpy(dst, p_ + at_, n);
    at_ += n;
    return true;
  }
  template <class T>
  T Get() {
    T v{};
    Bytes(&v, sizeof v);
    return v;
  }
  const uint8_t* Here() const { return p_ + at_; }
  bool Skip(size_t n) {
    if (!ok_ || n > n_ - at_) return ok_ = false;
    at_ += n;
    return true;
  }
  bool ok() const { return ok_; }
  size_t at() const { return at_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  bool ok_ = true;
};

struct Header {
  bool is_public = false;
  std::string partition;
  uint64_t tokens = 0;
  size_t payload_at = 0;   // where the tokens begin
  uint64_t file_bytes = 0;  // what the whole file must measure
};

// Reads up to `limit` bytes of the file at `path`.
bool ReadPrefix(const std::string& path, size_t limit, std::vector<uint8_t>& out, uint64_t& file_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) return false;
  file_size = static_cast<uint64_t>(end);
  in.seekg(0);
  out.resize(static_cast<size_t>(std::min<uint64_t>(file_size, limit)));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return static_cast<size_t>(in.gcount()) == out.size();
}

}  // namespace

PrefixDiskTier::PrefixDiskTier(Options options) : options_(std::move(options)) {
  std::string id = options_.model_identity + "|block_tokens=" + std::to_string(options_.block_tokens) +
                   "|floats_per_token=" + std::to_string(options_.floats_per_token) + "|delta=";
  for (const auto& [conv, s] : options_.delta_shape) id += std::to_string(conv) + "/" + std::to_string(s) + ",";
  const std::string digest = Sha256Hex(id);
  model_id_ = digest.substr(0, 32);
  for (int i = 0; i < 16; ++i) model_id_bytes_[i] = static_cast<uint8_t>(std::stoi(digest.substr(2 * i, 2), nullptr, 16));
  folder_ = (fs::path(options_.dir) / model_id_).string();
}

Result<std::unique_ptr<PrefixDiskTier>> PrefixDiskTier::Open(Options options) {
  if (options.dir.empty()) return Fail(Error::InvalidArgument("prefix disk tier: no directory"));
  if (options.max_bytes <= 0) return Fail(Error::InvalidArgument("prefix disk tier: prefix_disk_bytes must be positive"));
  if (options.block_tokens <= 0) return Fail(Error::InvalidArgument("prefix disk tier: block_tokens must be positive"));
  if (!(options.max_age_seconds >= 0) || !std::isfinite(options.max_age_seconds))
    return Fail(Error::InvalidArgument("prefix disk tier: prefix_disk_max_age_seconds must be 0 (no bound) or positive"));
  std::unique_ptr<PrefixDiskTier> tier(new PrefixDiskTier(std::move(options)));
  std::error_code ec;
  fs::create_directories(tier->folder_, ec);
  if (ec) return Fail(Error::InvalidArgument("prefix_disk_dir: cannot create " + tier->folder_ + ": " + ec.message()));
  // A directory we cannot write to is refused now, not at the first eviction.
  if (::access(tier->folder_.c_str(), W_OK | X_OK) != 0)
    return Fail(Error::InvalidArgument("prefix_disk_dir: " + tier->folder_ + " is not writable"));
  tier->Scan();
  return tier;
}

std::string PrefixDiskTier::PathOf(const std::string& key) const { return (fs::path(folder_) / (key + kSuffix)).string(); }

int64_t PrefixDiskTier::Now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void PrefixDiskTier::Touch(const std::string& key, File& file) {
  file.last_use = ++clock_;
  file.last_use_seconds = Now();
  // The mtime carries the use over a restart; failing to set it only ages
  // the file from its last write.
  const struct timespec at[2] = {{static_cast<time_t>(file.last_use_seconds), 0},
                                 {static_cast<time_t>(file.last_use_seconds), 0}};
  ::utimensat(AT_FDCWD, PathOf(key).c_str(), at, 0);
}

void PrefixDiskTier::ExpireOld() {
  if (options_.max_age_seconds <= 0) return;
  const int64_t now = Now();
  if (now < next_expiry_) return;
  // A file used at t is past the bound from t + floor(max_age) + 1 on.
  const int64_t age_steps = static_cast<int64_t>(std::floor(std::min(options_.max_age_seconds, 1e15))) + 1;
  std::vector<std::string> expired;
  int64_t next = INT64_MAX;
  for (const auto& [key, file] : files_) {
    if (static_cast<double>(now - file.last_use_seconds) > options_.max_age_seconds)
      expired.push_back(key);
    else
      next = std::min(next, file.last_use_seconds + age_steps);
  }
  for (const std::string& key : expired) {
    Remove(key);
    ++counters_.disk_expired;
  }
  next_expiry_ = next;
  if (!expired.empty())
    log::Info("prefix disk tier: " + std::to_string(expired.size()) + " entries unused for more than " +
              std::to_string(options_.max_age_seconds) + " s deleted");
}

std::vector<uint64_t> PrefixDiskTier::ChainKeys(const std::string& partition, bool is_public, std::span<const int> tokens,
                                                int64_t max_length) const {
  return ChainKeysFor(model_id_bytes_, options_.block_tokens, partition, is_public, tokens, max_length);
}

std::vector<uint64_t> PrefixDiskTier::ChainKeysFor(const uint8_t (&model_id)[16], int block_tokens,
                                                   const std::string& partition, bool is_public,
                                                   std::span<const int> tokens, int64_t max_length) {
  uint64_t h = 0;
  for (uint8_t b : model_id) h = Mix(h, b);
  h = Mix(h, is_public ? 1 : 2);
  if (!is_public) {
    h = Mix(h, partition.size());
    for (char c : partition) h = Mix(h, static_cast<uint8_t>(c));
  }
  const int64_t bt = block_tokens;
  const int64_t blocks = std::min<int64_t>(max_length, static_cast<int64_t>(tokens.size())) / bt;
  std::vector<uint64_t> keys;
  keys.reserve(static_cast<size_t>(std::max<int64_t>(blocks, 0)));
  for (int64_t k = 0; k < blocks; ++k) {
    for (int64_t i = k * bt; i < (k + 1) * bt; ++i) h = Mix(h, static_cast<uint32_t>(tokens[static_cast<size_t>(i)]));
    keys.push_back(h);
  }
  return keys;
}

std::string PrefixDiskTier::FileName(const std::string& partition, bool is_public, std::span<const int> tokens) const {
  const std::vector<uint64_t> keys = ChainKeys(partition, is_public, tokens, static_cast<int64_t>(tokens.size()));
  return keys.empty() ? std::string() : Hex64(keys.back()) + kSuffix;
}

std::string PrefixDiskTier::FileNameIn(const std::string& model_id, int block_tokens, const std::string& partition,
                                       bool is_public, std::span<const int> tokens) {
  uint8_t id[16] = {};
  for (size_t i = 0; i < 16 && 2 * i + 1 < model_id.size(); ++i)
    id[i] = static_cast<uint8_t>(std::stoi(model_id.substr(2 * i, 2), nullptr, 16));
  const std::vector<uint64_t> keys =
      ChainKeysFor(id, block_tokens, partition, is_public, tokens, static_cast<int64_t>(tokens.size()));
  return keys.empty() ? std::string() : Hex64(keys.back()) + kSuffix;
}

namespace {

// Parses and checks a header against what this tier stores. Empty string: fine.
std::string ParseHeader(Reader& r, const uint8_t (&model_id)[16], int block_tokens, size_t floats_per_token,
                        const std::vector<std::pair<uint64_t, uint64_t>>& delta_shape, Header& h) {
  char magic[8];
  if (!r.Bytes(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return "not a prefix cache file (magic)";
  const uint32_t version = r.Get<uint32_t>();
  if (!r.ok()) return "truncated header";
  if (version != PrefixDiskTier::kFormatVersion) return "format version " + std::to_string(version);
  const uint32_t bt = r.Get<uint32_t>();
  const uint64_t fpt = r.Get<uint64_t>();
  uint8_t id[16];
  r.Bytes(id, 16);
  const uint8_t pub = r.Get<uint8_t>();
  const uint32_t partition_bytes = r.Get<uint32_t>();
  const uint64_t tokens = r.Get<uint64_t>();
  const uint32_t layers = r.Get<uint32_t>();
  if (!r.ok()) return "truncated header";
  if (std::memcmp(id, model_id, 16) != 0) return "written for another model";
  if (bt != static_cast<uint32_t>(block_tokens) || fpt != floats_per_token) return "another block size or row size";
  if (pub > 1) return "bad public flag";
  if (partition_bytes > kMaxPartitionBytes) return "partition name too long";
  if (tokens == 0 || tokens > kMaxTokens || tokens % bt != 0) return "bad token count " + std::to_string(tokens);
  if (layers != delta_shape.size() || layers > kMaxLayers) return "another recurrent state shape";
  uint64_t state_floats = 0;
  for (uint32_t i = 0; i < layers; ++i) {
    const uint64_t conv = r.Get<uint64_t>(), s = r.Get<uint64_t>();
    if (!r.ok()) return "truncated header";
    if (conv != delta_shape[i].first || s != delta_shape[i].second) return "another recurrent state shape";
    state_floats += conv + s;
  }
  h.is_public = pub == 1;
  h.partition.resize(partition_bytes);
  if (!r.Bytes(h.partition.data(), partition_bytes)) return "truncated header";
  if (h.is_public && partition_bytes != 0) return "a public entry with a partition";
  h.tokens = tokens;
  h.payload_at = r.at();
  // tokens <= 2^31 and floats_per_token is the pool's: these products fit.
  uint64_t rows = 0;
  if (__builtin_mul_overflow(tokens, static_cast<uint64_t>(floats_per_token), &rows)) return "size overflow";
  h.file_bytes = h.payload_at + tokens * 4 + rows * 4 + state_floats * 4 + kDigestBytes;
  return {};
}

}  // namespace

void PrefixDiskTier::Scan() {
  std::error_code ec;
  struct Seen {
    std::string key;
    File file;
    int64_t mtime_ns;
  };
  std::vector<Seen> seen;
  for (auto it = fs::directory_iterator(folder_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::path p = it->path();
    const std::string name = p.filename().string();
    if (name.find(".tmp.") != std::string::npos) {  // a write that never finished
      fs::remove(p, ec);
      continue;
    }
    if (p.extension() != kSuffix || !it->is_regular_file(ec)) continue;
    const std::string key = p.stem().string();
    std::vector<uint8_t> head;
    uint64_t size = 0;
    std::string why;
    Header h;
    if (!ReadPrefix(p.string(), kFixedHeader + 16 * kMaxLayers + kMaxPartitionBytes, head, size)) {
      why = "unreadable";
    } else {
      Reader r(head.data(), head.size());
      why = ParseHeader(r, model_id_bytes_, options_.block_tokens, options_.floats_per_token, options_.delta_shape, h);
      if (why.empty() && h.file_bytes != size)
        why = "size " + std::to_string(size) + " bytes, the header says " + std::to_string(h.file_bytes) + " (truncated?)";
    }
    if (why.empty()) {  // the name must be the key of what the header says it holds
      std::vector<uint8_t> all;
      uint64_t again = 0;
      if (!ReadPrefix(p.string(), h.payload_at + h.tokens * 4, all, again) || all.size() < h.payload_at + h.tokens * 4) {
        why = "unreadable tokens";
      } else {
        std::vector<int> tokens(h.tokens);
        std::memcpy(tokens.data(), all.data() + h.payload_at, h.tokens * 4);
        if (FileName(h.partition, h.is_public, tokens) != name) why = "its name is not the key of its partition and tokens";
      }
    }
    if (!why.empty()) {
      log::Warn("prefix disk tier: refused " + p.string() + ": " + why + "; deleted");
      ++counters_.disk_refused;
      fs::remove(p, ec);
      continue;
    }
    struct stat st {};
    const int64_t mtime_ns = ::stat(p.c_str(), &st) == 0
                                 ? static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec
                                 : 0;
    seen.push_back({key,
                    File{static_cast<int64_t>(size), static_cast<int64_t>(h.tokens), h.is_public, 0,
                         static_cast<int64_t>(st.st_mtim.tv_sec)},
                    mtime_ns});
  }
  std::sort(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.mtime_ns < b.mtime_ns; });
  for (Seen& s : seen) {
    s.file.last_use = ++clock_;
    bytes_ += s.file.bytes;
    files_[s.key] = s.file;
  }
  ExpireOld();
  MakeRoom(0);
  if (!files_.empty())
    log::Info("prefix disk tier: " + std::to_string(files_.size()) + " entries (" + std::to_string(bytes_) +
              " bytes) in " + folder_);
}

void PrefixDiskTier::Remove(const std::string& name) {
  const std::string key = name;  // `name` may be the map's own key, erased below
  auto it = files_.find(key);
  if (it != files_.end()) {
    bytes_ -= it->second.bytes;
    files_.erase(it);
  }
  std::error_code ec;
  fs::remove(PathOf(key), ec);
}

void PrefixDiskTier::Refuse(const std::string& key, const std::string& why) {
  log::Warn("prefix disk tier: refused " + PathOf(key) + ": " + why + "; deleted, the prefix is recomputed");
  ++counters_.disk_refused;
  Remove(key);
}

void PrefixDiskTier::MakeRoom(int64_t incoming) {
  while (!files_.empty() && bytes_ + incoming > options_.max_bytes) {
    auto oldest = files_.begin();
    for (auto it = files_.begin(); it != files_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    Remove(oldest->first);
    ++counters_.disk_evictions;
  }
}

Status PrefixDiskTier::Write(const KvPool& pool, std::span<const int> tokens, std::span<const int> blocks,
                             const std::vector<DeltaLayerState>& delta, const std::string& partition, bool is_public) {
  const int64_t bt = options_.block_tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0 || n % bt != 0 || static_cast<int64_t>(blocks.size()) * bt < n)
    return Fail(Error::InvalidArgument("prefix disk tier: an entry must be whole blocks"));
  if (pool.floats_per_token() != options_.floats_per_token || pool.block_tokens() != bt)
    return Fail(Error::InvalidArgument("prefix disk tier: the pool's rows are not this tier's"));
  if (delta.size() != options_.delta_shape.size())
    return Fail(Error::InvalidArgument("prefix disk tier: the recurrent state has another shape"));
  ExpireOld();
  const std::vector<uint64_t> keys = ChainKeys(is_public ? std::string() : partition, is_public, tokens, n);
  const std::string key = Hex64(keys.back());
  if (auto it = files_.find(key); it != files_.end()) {
    Touch(key, it->second);
    return Ok();
  }
  const size_t fpt = options_.floats_per_token;
  const std::string& part = is_public ? std::string() : partition;
  std::vector<uint8_t> buf;
  size_t state_floats = 0;
  for (size_t i = 0; i < delta.size(); ++i) {
    if (delta[i].conv_tail.size() != options_.delta_shape[i].first || delta[i].S.size() != options_.delta_shape[i].second)
      return Fail(Error::InvalidArgument("prefix disk tier: the recurrent state has another shape"));
    state_floats += delta[i].conv_tail.size() + delta[i].S.size();
  }
  const size_t total = kFixedHeader + 16 * delta.size() + part.size() + static_cast<size_t>(n) * 4 +
                       static_cast<size_t>(n) * fpt * 4 + state_floats * 4 + kDigestBytes;
  if (static_cast<int64_t>(total) > options_.max_bytes) return Ok();  // would evict everything and still not fit
  buf.reserve(total);
  Writer w(buf);
  w.Bytes(kMagic, 8);
  w.Put<uint32_t>(kFormatVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(bt));
  w.Put<uint64_t>(fpt);
  w.Bytes(model_id_bytes_, 16);
  w.Put<uint8_t>(is_public ? 1 : 0);
  w.Put<uint32_t>(static_cast<uint32_t>(part.size()));
  w.Put<uint64_t>(static_cast<uint64_t>(n));
  w.Put<uint32_t>(static_cast<uint32_t>(delta.size()));
  for (const DeltaLayerState& d : delta) {
    w.Put<uint64_t>(d.conv_tail.size());
    w.Put<uint64_t>(d.S.size());
  }
  w.Bytes(part.data(), part.size());
  w.Bytes(tokens.data(), static_cast<size_t>(n) * 4);
  for (int64_t b = 0; b < n / bt; ++b) {  // each block in the one-stripe layout (KvPool::CopyBlockOut)
    const size_t at = buf.size();
    buf.resize(at + pool.block_floats() * 4);
    pool.CopyBlockOut(blocks[static_cast<size_t>(b)], buf.data() + at);
  }
  for (const DeltaLayerState& d : delta) {
    w.Bytes(d.conv_tail.data(), d.conv_tail.size() * 4);
    w.Bytes(d.S.data(), d.S.size() * 4);
  }
  Sha256 sha;
  sha.Update(buf.data(), buf.size());
  const std::string hex = sha.HexDigest();
  for (size_t i = 0; i < kDigestBytes; ++i) buf.push_back(static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16)));

  MakeRoom(static_cast<int64_t>(buf.size()));
  const std::string path = PathOf(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    ++counters_.disk_write_failures;
    return Fail(Error::Internal("prefix disk tier: cannot create " + tmp + ": " + std::strerror(errno)));
  }
  size_t done = 0;
  while (done < buf.size()) {
    const ssize_t k = ::write(fd, buf.data() + done, buf.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += static_cast<size_t>(k);
  }
  const int err = done == buf.size() ? 0 : errno;
  ::close(fd);
  if (err != 0 || done != buf.size() || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string what = std::strerror(err != 0 ? err : errno);
    ::unlink(tmp.c_str());
    ++counters_.disk_write_failures;
    return Fail(Error::Internal("prefix disk tier: writing " + path + " failed: " + what));
  }
  File& stored = files_[key] = File{static_cast<int64_t>(buf.size()), n, is_public, 0, 0};
  Touch(key, stored);
  if (options_.max_age_seconds > 0) next_expiry_ = std::min(next_expiry_, stored.last_use_seconds);
  bytes_ += static_cast<int64_t>(buf.size());
  ++counters_.disk_writes;
  counters_.disk_write_bytes += buf.size();
  return Ok();
}

std::optional<PrefixDiskTier::Found> PrefixDiskTier::Find(std::span<const int> tokens, int64_t max_length,
                                                          const std::string& partition, int64_t public_length,
                                                          int64_t longer_than) const {
  if (files_.empty()) return std::nullopt;
  const std::vector<uint64_t> own = ChainKeys(partition, false, tokens, max_length);
  const std::vector<uint64_t> pub = ChainKeys({}, true, tokens, std::min(max_length, public_length));
  const int64_t bt = options_.block_tokens;
  const int64_t now = options_.max_age_seconds > 0 ? Now() : 0;
  auto usable = [&](const File& f) {
    return options_.max_age_seconds <= 0 || static_cast<double>(now - f.last_use_seconds) <= options_.max_age_seconds;
  };
  for (int64_t k = static_cast<int64_t>(own.size()) - 1; k >= 0; --k) {
    const int64_t len = (k + 1) * bt;
    if (len <= longer_than) break;
    if (auto it = files_.find(Hex64(own[static_cast<size_t>(k)])); it != files_.end() && !it->second.is_public &&
                                                                   it->second.length == len && usable(it->second))
      return Found{len, false, it->first};
    if (k < static_cast<int64_t>(pub.size()))
      if (auto it = files_.find(Hex64(pub[static_cast<size_t>(k)])); it != files_.end() && it->second.is_public &&
                                                                     it->second.length == len && usable(it->second))
        return Found{len, true, it->first};
  }
  return std::nullopt;
}

Result<PrefixDiskTier::Restored> PrefixDiskTier::Read(KvPool& pool, const Found& found, std::span<const int> tokens,
                                                      const std::string& partition) {
  auto known = files_.find(found.key);
  if (known == files_.end()) return Fail(Error::NotFound("prefix disk tier: no entry " + found.key));
  const int64_t bt = options_.block_tokens;
  const int64_t nblocks = found.length / bt;
  if (pool.free_blocks() < nblocks)
    return Fail(Error::ResourceExhausted("prefix disk tier: no free pool blocks to restore into"));
  const std::string path = PathOf(found.key);
  std::vector<uint8_t> buf;
  uint64_t size = 0;
  // The size the index recorded bounds the read: a file grown since is refused below.
  if (!ReadPrefix(path, static_cast<size_t>(known->second.bytes) + 1, buf, size)) {
    Refuse(found.key, "unreadable");
    return Fail(Error::Corruption(path, "unreadable"));
  }
  Reader r(buf.data(), buf.size());
  Header h;
  std::string why = ParseHeader(r, model_id_bytes_, options_.block_tokens, options_.floats_per_token,
                                options_.delta_shape, h);
  if (why.empty() && (h.file_bytes != size || size != buf.size())) why = "truncated or grown since it was indexed";
  if (why.empty() && buf.size() >= kDigestBytes) {
    Sha256 sha;
    sha.Update(buf.data(), buf.size() - kDigestBytes);
    const std::string hex = sha.HexDigest();
    for (size_t i = 0; i < kDigestBytes && why.empty(); ++i)
      if (static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16)) != buf[buf.size() - kDigestBytes + i])
        why = "checksum mismatch";
  }
  if (why.empty() && (h.is_public != found.is_public || (!h.is_public && h.partition != partition)))
    why = "written for another partition";
  if (why.empty() && (static_cast<int64_t>(h.tokens) != found.length || static_cast<int64_t>(tokens.size()) < found.length ||
                      std::memcmp(buf.data() + h.payload_at, tokens.data(), static_cast<size_t>(found.length) * 4) != 0))
    why = "holds other tokens";
  if (!why.empty()) {
    Refuse(found.key, why);
    return Fail(Error::Corruption(path, why));
  }
  Restored out;
  out.delta.resize(options_.delta_shape.size());
  const size_t fpt = options_.floats_per_token;
  const uint8_t* rows = buf.data() + h.payload_at + static_cast<size_t>(found.length) * 4;
  const size_t block_bytes = static_cast<size_t>(bt) * fpt * 4;
  const uint8_t* state = rows + static_cast<size_t>(nblocks) * block_bytes;
  for (size_t i = 0; i < out.delta.size(); ++i) {
    out.delta[i].conv_tail.resize(options_.delta_shape[i].first);
    out.delta[i].S.resize(options_.delta_shape[i].second);
    std::memcpy(out.delta[i].conv_tail.data(), state, out.delta[i].conv_tail.size() * 4);
    state += out.delta[i].conv_tail.size() * 4;
    std::memcpy(out.delta[i].S.data(), state, out.delta[i].S.size() * 4);
    state += out.delta[i].S.size() * 4;
  }
  for (int64_t b = 0; b < nblocks; ++b) {
    Result<int> block = pool.Allocate();
    if (!block) {  // checked above; cannot happen
      for (int got : out.blocks) pool.Unref(got);
      return Fail(block.error());
    }
    out.blocks.push_back(*block);
    pool.CopyBlockIn(*block, rows + static_cast<size_t>(b) * block_bytes);
  }
  Touch(found.key, known->second);
  ++counters_.disk_hits;
  counters_.disk_hit_tokens += static_cast<uint64_t>(found.length);
  counters_.disk_read_bytes += buf.size();
  return out;
}

void PrefixDiskTier::FillStats(PrefixCacheStats& s) const {
  s.disk_bytes = bytes_;
  s.disk_limit_bytes = options_.max_bytes;
  s.disk_entries = static_cast<int64_t>(files_.size());
  s.disk_writes = counters_.disk_writes;
  s.disk_write_bytes = counters_.disk_write_bytes;
  s.disk_write_failures = counters_.disk_write_failures;
  s.disk_hits = counters_.disk_hits;
  s.disk_hit_tokens = counters_.disk_hit_tokens;
  s.disk_read_bytes = counters_.disk_read_bytes;
  s.disk_refused = counters_.disk_refused;
  s.disk_evictions = counters_.disk_evictions;
  s.disk_expired = counters_.disk_expired;
}

}  // namespace moeserve::engine

// The streamed writer of a converted directory (converted_dir.hpp).
//
// A shard's header must come before its data, but a tensor's shape and
// dtype are known only once it is made. So each shard reserves room for its
// header (an upper bound from the names it may hold), the tensors are
// appended after it as they are made, and the header is written last into
// the reserved room, padded with spaces (safetensors allows trailing spaces
// in the header).
#include "families/converted_dir.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moeserve/common/durable_file.hpp"
#include "moeserve/common/json_limits.hpp"

namespace moeserve::engine::families {
namespace {

namespace fs = std::filesystem;

// What a header entry can take besides its name: the dtype, a shape of at
// most 8 dimensions and two offsets of at most 20 digits each, and JSON.
constexpr size_t kEntryBytes = 8 * 21 + 2 * 21 + 80;

struct ShardEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

class ShardWriter {
 public:
  // `reserve`: the header room, at least what the shard's entries can take.
  static Result<ShardWriter> Create(const std::string& path, size_t reserve) {
    ShardWriter w;
    w.path_ = path;
    w.reserve_ = reserve + (8 - reserve % 8) % 8;
    w.f_ = std::fopen(path.c_str(), "wb");
    if (!w.f_) return Fail(Error::Io(path + ": cannot create"));
    if (std::fseek(w.f_, static_cast<long>(8 + w.reserve_), SEEK_SET) != 0) return Fail(Error::Io(path + ": seek failed"));
    return w;
  }
  ShardWriter() = default;
  ShardWriter(ShardWriter&& o) noexcept { *this = std::move(o); }
  ShardWriter& operator=(ShardWriter&& o) noexcept {
    std::swap(f_, o.f_);
    path_ = std::move(o.path_);
    reserve_ = o.reserve_;
    data_ = o.data_;
    entries_ = std::move(o.entries_);
    return *this;
  }
  ~ShardWriter() {
    if (f_) std::fclose(f_);
  }

  Status Append(const TensorView& t) {
    if (t.shape.size() > 8) return Fail(Error::InvalidArgument("tensor '" + t.name + "': more than 8 dimensions"));
    if (std::fwrite(t.data, 1, t.nbytes, f_) != t.nbytes) return Fail(Error::Io(path_ + ": write failed"));
    entries_.push_back({t.name, t.dtype, t.shape, data_, data_ + t.nbytes});
    data_ += t.nbytes;
    return Ok();
  }
  uint64_t data_bytes() const { return data_; }
  const std::vector<ShardEntry>& entries() const { return entries_; }

  // The header into its room, then flush, close and fsync.
  Status Finish() {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    for (const ShardEntry& e : entries_)
      header[e.name] = {{"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
    std::string text = header.dump();
    if (text.size() > reserve_)
      return Fail(Error::Internal(path_ + ": header of " + std::to_string(text.size()) + " bytes exceeds the " +
                                  std::to_string(reserve_) + " reserved"));
    text.resize(reserve_, ' ');
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(reserve_) >> (8 * i));
    Status st = Ok();
    if (std::fseek(f_, 0, SEEK_SET) != 0 || std::fwrite(length, 1, 8, f_) != 8 ||
        std::fwrite(text.data(), 1, text.size(), f_) != text.size() || std::fflush(f_) != 0)
      st = Fail(Error::Io(path_ + ": write failed"));
    if (std::fclose(f_) != 0 && st) st = Fail(Error::Io(path_ + ": close failed"));
    f_ = nullptr;
    if (st) st = FsyncPath(path_);
    return st;
  }

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  size_t reserve_ = 0;
  uint64_t data_ = 0;
  std::vector<ShardEntry> entries_;
};

// The published tensors and what describes them are not carried over.
bool IsCheckpointFile(const std::string& name) {
  return name.ends_with(".safetensors") || name == "model.safetensors.index.json" || name == "config.json" ||
         name == "manifest.json";
}

std::string ShardName(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return name;
}

}  // namespace

namespace {

// Everything of OUT written into `partial`.
Status WritePartial(const std::string& dir, const std::string& partial, const ConvertedDirPlan& plan) {
  std::error_code ec;

  // Shards are numbered once their count is known: written under
  // temporary names first. A shard's header room covers every name left,
  // since any of them may still go into it.
  size_t names_left = 0;
  for (const std::string& n : plan.names) names_left += n.size() + kEntryBytes;
  std::vector<std::vector<ShardEntry>> shards;
  std::optional<ShardWriter> shard;
  uint64_t total = 0;
  const auto close_shard = [&]() -> Status {
    if (!shard) return Ok();
    MOE_TRY(shard->Finish());
    shards.push_back(shard->entries());
    shard.reset();
    return Ok();
  };
  for (const std::string& name : plan.names) {
    MOE_ASSIGN_OR_RETURN(HeldTensor t, plan.source->Get(name));
    t.view.name = name;
    if (shard && shard->data_bytes() > 0 && shard->data_bytes() + t.view.nbytes > plan.max_shard_bytes)
      MOE_TRY(close_shard());
    if (!shard) {
      const std::string path = (fs::path(partial) / ("shard-" + std::to_string(shards.size()) + ".tmp")).string();
      MOE_ASSIGN_OR_RETURN(ShardWriter w, ShardWriter::Create(path, names_left + 64));
      shard.emplace(std::move(w));
    }
    MOE_TRY(shard->Append(t.view));
    total += t.view.nbytes;
    names_left -= name.size() + kEntryBytes;
  }
  MOE_TRY(close_shard());

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = ShardName(k, shards.size());
    fs::rename(fs::path(partial) / ("shard-" + std::to_string(k) + ".tmp"), fs::path(partial) / file, ec);
    if (ec) return Fail(Error::Io(partial + ": cannot name shard " + file + ": " + ec.message()));
    for (const ShardEntry& e : shards[k]) weight_map[e.name] = file;
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  MOE_TRY(WriteFileDurably((fs::path(partial) / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  MOE_TRY(WriteFileDurably((fs::path(partial) / "config.json").string(), plan.config_json));
  return CopySideFiles(dir, partial);
}

}  // namespace

Status CopySideFiles(const std::string& dir, const std::string& partial) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (IsCheckpointFile(name) || !e.is_regular_file(ec)) continue;
    if (!fs::copy_file(e.path(), fs::path(partial) / name, ec) || ec)
      return Fail(Error::Io(e.path().string() + ": cannot copy: " + ec.message()));
    MOE_TRY(FsyncPath((fs::path(partial) / name).string()));
  }
  if (ec) return Fail(Error::Io(dir + ": cannot list: " + ec.message()));
  return Ok();
}

Status WriteConvertedDir(const std::string& dir, const std::string& out, const ConvertedDirPlan& plan) {
  std::error_code ec;
  if (fs::exists(out, ec)) return Fail(Error::InvalidArgument(out + ": already exists (a converted directory is written anew)"));
  if (!plan.source || plan.names.empty()) return Fail(Error::InvalidArgument(dir + ": nothing to convert"));
  const std::string partial = out + ".partial";
  fs::remove_all(partial, ec);
  if (!fs::create_directories(partial, ec) || ec) return Fail(Error::Io(partial + ": cannot create: " + ec.message()));
  if (Status st = WritePartial(dir, partial, plan); !st) {
    fs::remove_all(partial, ec);  // nothing half-written stays behind
    return st;
  }
  fs::rename(partial, out, ec);
  if (ec) return Fail(Error::Io(out + ": cannot rename " + partial + " into place: " + ec.message()));
  return FsyncPath(fs::path(out).parent_path().empty() ? "." : fs::path(out).parent_path().string());
}

namespace {

Result<nlohmann::ordered_json> ReadConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json j,
                       ParseJsonBounded<nlohmann::ordered_json>(ss.str(), {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth},
                                                                path));
  if (!j.is_object()) return Fail(Error::InvalidArgument(path + ": not a JSON object"));
  return j;
}

}  // namespace

Result<nlohmann::ordered_json> ConvertedConfig(const std::string& dir, ExpertFormat experts) {
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json j, ReadConfig(dir));
  j["moeserve_converted"] = {{"routed_experts", std::string(ExpertFormatName(experts))}};
  return j;
}

Result<std::optional<ExpertFormat>> ConvertedMarker(const std::string& dir) {
  MOE_ASSIGN_OR_RETURN(nlohmann::ordered_json j, ReadConfig(dir));
  if (!j.contains("moeserve_converted")) return std::optional<ExpertFormat>();
  const std::string path = (fs::path(dir) / "config.json").string();
  const auto& m = j["moeserve_converted"];
  if (!m.is_object() || !m.contains("routed_experts") || !m["routed_experts"].is_string())
    return Fail(Error::InvalidArgument(path + ": moeserve_converted: must be an object with a routed_experts string"));
  const std::string f = m["routed_experts"].get<std::string>();
  if (f == "mxfp4") return std::optional<ExpertFormat>(ExpertFormat::kMxfp4);
  if (f == "bf16") return std::optional<ExpertFormat>(ExpertFormat::kBf16);
  return Fail(Error::InvalidArgument(path + ": moeserve_converted.routed_experts: '" + f +
                                     "' is not \"mxfp4\" or \"bf16\""));
}

}  // namespace moeserve::engine::families

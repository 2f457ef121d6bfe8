#include "moeserve/engine/safetensors.hpp"

#include "moeserve/common/durable_file.hpp"
#include "moeserve/common/json_limits.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace moeserve::engine {

using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------- reading ---

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Fail(Error::Io(path + ": cannot open: " + std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Fail(Error::Io(path + ": cannot stat: " + std::strerror(err)));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Fail(Error::Io(path + ": cannot mmap: " + std::strerror(err)));
    }
    f->base_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file alive
  MOE_TRY(f->Parse());
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string name, std::span<const uint8_t> bytes) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(name);
  f->base_ = bytes.data();
  f->size_ = bytes.size();
  MOE_TRY(f->Parse());
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

namespace {

// Multiplies non-negative sizes, refusing overflow past 2^62.
bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > (uint64_t{1} << 62) / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

Status SafetensorsFile::Parse() {
  auto corrupt = [&](const std::string& what) { return Fail(Error::Corruption(path_, what)); };
  if (size_ < 8) return corrupt("file is " + std::to_string(size_) + " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base_[i];
  if (n > size_ - 8)
    return corrupt("header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size_ - 8) +
                   " bytes after the length field)");
  if (n > kMaxSafetensorsHeaderBytes)
    return corrupt("header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  if (n < 2) return corrupt("header length " + std::to_string(n) + " is too short for a JSON object");

  // The length is bounded above; the depth is bounded here, before anything
  // (an error message's dump()) could recurse through a hostile header.
  auto parsed = ParseJsonBounded<json>(std::string_view(reinterpret_cast<const char*>(base_ + 8), n),
                                       {.max_bytes = kMaxSafetensorsHeaderBytes, .max_depth = kMaxJsonDepth}, "header");
  if (!parsed) return corrupt(parsed.error().message());
  json header = std::move(*parsed);
  if (!header.is_object()) return corrupt("header is not a JSON object");

  const uint8_t* data = base_ + 8 + n;
  const uint64_t data_size = size_ - 8 - n;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return corrupt("__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return corrupt("__metadata__ entry '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return corrupt("tensor '" + name + "': " + what); };
    if (!v.is_object()) return bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("missing or non-string 'dtype'");
    std::string dtype_name = v["dtype"].get<std::string>();
    auto dtype = ParseDType(dtype_name);
    if (!dtype) return bad("unknown dtype '" + dtype_name + "'");
    if (!v.contains("shape") || !v["shape"].is_array()) return bad("missing or non-array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      return bad("'data_offsets' must be an array of two integers");

    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    uint64_t expected = DTypeSize(*dtype);
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape " + v["shape"].dump() + " has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      // Checked on its own: beside a zero dimension the product stays 0, and
      // the int64 shape would hold a negative dimension.
      if (dim > static_cast<uint64_t>(INT64_MAX) || !CheckedMul(expected, dim, &expected))
        return bad("shape " + v["shape"].dump() + " is too large");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad("data_offsets " + off.dump() + " are not non-negative integers");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) return bad("data_offsets " + off.dump() + " end before they begin");
    if (end > data_size)
      return bad("data_offsets " + off.dump() + " run past the end of the data (" + std::to_string(data_size) +
                 " bytes)");
    if (end - begin != expected)
      return bad("shape " + t.ShapeString() + " of " + dtype_name + " needs " + std::to_string(expected) +
                 " bytes but data_offsets " + off.dump() + " hold " + std::to_string(end - begin));
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    t.file = &path_;
    spans.push_back({begin, end, tensors_.size()});
    by_name_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span& prev = spans[i - 1];
    const Span& cur = spans[i];
    // Zero-byte tensors occupy no bytes, so they cannot overlap anything.
    if (cur.begin < prev.end && cur.end > cur.begin)
      return corrupt("tensor '" + tensors_[cur.index].name + "' overlaps tensor '" + tensors_[prev.index].name +
                     "' (bytes " + std::to_string(cur.begin) + ".." + std::to_string(prev.end) + ")");
  }
  return Ok();
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Result<Checkpoint> Checkpoint::FromImage(std::string name, std::vector<uint8_t> image) {
  Checkpoint ck;
  ck.image_ = std::make_unique<std::vector<uint8_t>>(std::move(image));
  MOE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::FromBytes(std::move(name), *ck.image_));
  for (const auto& t : f->tensors()) ck.by_name_[t.name] = &t;
  ck.shards_.push_back(std::move(f));
  return ck;
}

Result<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint ck;
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    if (!in) return Fail(Error::Io(index_path.string() + ": cannot open"));
    std::ostringstream index_text;
    index_text << in.rdbuf();
    // ~100 bytes a tensor: 256 MiB is millions of tensors.
    constexpr JsonLimits kIndexJsonLimits{.max_bytes = 256u << 20, .max_depth = kMaxJsonDepth};
    auto parsed = ParseJsonBounded<json>(index_text.str(), kIndexJsonLimits, index_path.string());
    if (!parsed) return Fail(Error(ErrorCode::kCorruption, parsed.error().message()));
    json index = std::move(*parsed);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return Fail(Error::Corruption(index_path.string(), "missing object 'weight_map'"));
    std::map<std::string, SafetensorsFile*> open;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return Fail(Error::Corruption(index_path.string(), "weight_map entry '" + it.key() + "' is not a file name"));
      std::string shard = it.value().get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        return Fail(Error::Corruption(index_path.string(),
                                      "weight_map entry '" + it.key() + "' names '" + shard + "', not a file in the model folder"));
      if (!open.count(shard)) {
        MOE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((fs::path(dir) / shard).string()));
        open[shard] = f.get();
        ck.shards_.push_back(std::move(f));
      }
      const TensorView* t = open[shard]->Find(it.key());
      if (!t)
        return Fail(Error::Corruption(index_path.string(),
                                      "tensor '" + it.key() + "' is mapped to " + shard + " but that shard does not hold it"));
      ck.by_name_[it.key()] = t;
    }
    for (const auto& s : ck.shards_)
      for (const auto& t : s->tensors())
        if (!ck.by_name_.count(t.name))
          return Fail(Error::Corruption(index_path.string(), "tensor '" + t.name + "' in " + s->path() +
                                                                 " is missing from weight_map"));
    return ck;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  if (ec) return Fail(Error::Io(dir + ": cannot list: " + ec.message()));
  if (files.empty()) return Fail(Error::NotFound(dir + ": no *.safetensors file"));
  if (files.size() > 1)
    return Fail(Error::Corruption(dir, std::to_string(files.size()) +
                                           " safetensors shards but no model.safetensors.index.json to map them"));
  MOE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(files[0].string()));
  for (const auto& t : f->tensors()) ck.by_name_[t.name] = &t;
  ck.shards_.push_back(std::move(f));
  return ck;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const TensorView*> Checkpoint::AllTensors() const {
  std::vector<const TensorView*> out;
  for (const auto& [_, t] : by_name_) out.push_back(t);
  return out;
}

// ---------------------------------------------------------------- writing ---

Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  uint64_t expected = DTypeSize(dtype);
  for (auto d : shape) {
    if (d < 0 || !CheckedMul(expected, static_cast<uint64_t>(d), &expected))
      return Fail(Error::InvalidArgument("tensor '" + name + "': bad shape"));
  }
  if (expected != bytes.size())
    return Fail(Error::InvalidArgument("tensor '" + name + "': shape needs " + std::to_string(expected) +
                                       " bytes, got " + std::to_string(bytes.size())));
  for (const auto& e : entries_)
    if (e.name == name) return Fail(Error::InvalidArgument("tensor '" + name + "' added twice"));
  data_bytes_ += bytes.size();
  entries_.push_back({std::move(name), dtype, std::move(shape), std::move(bytes)});
  return Ok();
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

std::vector<uint8_t> SafetensorsWriter::Serialize() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as upstream does.
  while ((8 + text.size()) % 8) text.push_back(' ');
  std::vector<uint8_t> out;
  out.reserve(8 + text.size() + offset);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& e : entries_) out.insert(out.end(), e.bytes.begin(), e.bytes.end());
  return out;
}

Status SafetensorsWriter::WriteFile(const std::string& path) const {
  auto bytes = Serialize();
  return WriteFileDurably(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace moeserve::engine

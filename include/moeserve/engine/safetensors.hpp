// safetensors checkpoints: a memory-mapped, zero-copy reader, a writer, and
// sharded checkpoints described by model.safetensors.index.json.
//
// Reader guarantee: Open() either returns a file whose every tensor lies
// inside the file, does not overlap another, and has exactly
// prod(shape) * sizeof(dtype) bytes, or an Error naming the file, the tensor
// and what is wrong. It never reads past the mapping and never crashes on
// malformed input. Data pointers stay valid while the SafetensorsFile lives.
//
// Thread safety: a SafetensorsFile / Checkpoint is immutable after Open() and
// may be read from any number of threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/dtype.hpp"

namespace moeserve::engine {

// Refuse absurd headers before parsing them (the upstream format caps the
// header at 100 MB too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // unaligned: copy or convert before typed access
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the shard that holds it, for error messages

  int64_t numel() const;
  std::string ShapeString() const;  // "[4, 256]"
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses a file image already in memory (the fuzz tests use this); the
  // bytes must outlive the returned object.
  static Result<std::unique_ptr<SafetensorsFile>> FromBytes(std::string name, std::span<const uint8_t> bytes);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const TensorView* Find(const std::string& name) const;
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// A model directory's tensors: one model.safetensors, or shards listed by
// model.safetensors.index.json. Every tensor named by the index must be in
// the shard the index names.
class Checkpoint {
 public:
  static Result<Checkpoint> Open(const std::string& dir);
  // A checkpoint held in memory: one safetensors file image (a family's
  // loader converts a published checkpoint into the engine's names and
  // dtypes this way). `name` stands for the file in error messages.
  static Result<Checkpoint> FromImage(std::string name, std::vector<uint8_t> image);

  const TensorView* Find(const std::string& name) const;
  std::vector<const TensorView*> AllTensors() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*> by_name_;
  // FromImage's bytes, which its shard views (heap storage: stable under moves).
  std::unique_ptr<std::vector<uint8_t>> image_;
};

// Builds a safetensors file in memory and writes it atomically (temporary
// file, fsync, rename: WriteFileDurably). Tensors are stored in the order
// they were added.
class SafetensorsWriter {
 public:
  Status Add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void SetMetadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }
  size_t data_bytes() const { return data_bytes_; }
  size_t tensor_count() const { return entries_.size(); }
  std::vector<std::string> names() const;
  // The complete file image (header length, padded header, data).
  std::vector<uint8_t> Serialize() const;
  Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

}  // namespace moeserve::engine

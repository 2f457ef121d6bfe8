// Where the engine's weight loader reads tensors: a checkpoint's mapped
// views, or a family that converts a published checkpoint tensor by tensor
// as the loader asks for each (engine/families/deepseek_v32), so that a
// load holds the loaded weights plus one converted tensor, never the whole
// converted checkpoint beside them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/kernels/weight_memory.hpp"

namespace moeserve::engine {

// A tensor and, when it was made for the caller, its storage. view.data
// points into `bytes` or `storage` (moving a HeldTensor keeps it valid) or
// into a mapped checkpoint that outlives the loader. `storage` is huge-page
// weight memory that was never zeroed (a converting source writes it whole):
// a loader may keep it as it is (WeightArena::Adopt) instead of copying.
// `mapping`, when set, owns the read-only file mapping view.data points
// into (a published shard whose bytes are already what the kernels read):
// a loader may keep the view as the weight, in place, by keeping `mapping`
// for the weights' life (WeightArena::KeepMapped) instead of copying.
struct HeldTensor {
  TensorView view;
  std::vector<uint8_t> bytes;
  kernels::WeightBuffer storage;
  std::shared_ptr<const void> mapping;

  HeldTensor() = default;
  HeldTensor(HeldTensor&&) = default;
  HeldTensor& operator=(HeldTensor&&) = default;
  HeldTensor(const HeldTensor&) = delete;
  HeldTensor& operator=(const HeldTensor&) = delete;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor in the engine's names and dtypes (model.md 1.1, 1.2);
  // NotFound when there is none, the source's own error when making it
  // fails. Not thread-safe.
  virtual Result<HeldTensor> Get(const std::string& name) = 0;
};

// A checkpoint's tensors as they are (no copy).
class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}
  Result<HeldTensor> Get(const std::string& name) override {
    const TensorView* t = checkpoint_.Find(name);
    if (!t) return Fail(Error::NotFound("tensor '" + name + "' is missing"));
    HeldTensor h;
    h.view = *t;
    return h;
  }

 private:
  const Checkpoint& checkpoint_;
};

}  // namespace moeserve::engine

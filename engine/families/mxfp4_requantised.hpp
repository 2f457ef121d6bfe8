// Routed experts requantised from BF16 to MXFP4 as the loader asks for them
// (model.md section 7's encoder): a source over a checkpoint whose experts
// are BF16 stacks `X.weight` [E, rows, cols] that gives `X.blocks`
// [E, rows, cols / 32, 16] and `X.scales` [E, rows, cols / 32] in their
// place, every other tensor as it is. Used by moe-dsa-v1 at load
// (experts: mxfp4 on a checkpoint with BF16 experts) and by its converted
// directories. Internal to the families.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_source.hpp"

namespace moeserve::engine::families {

class Mxfp4RequantisedSource final : public TensorSource {
 public:
  // `experts`: the bases X of the BF16 stacks to requantise ("layers.1.ffn.experts.w13").
  Mxfp4RequantisedSource(std::shared_ptr<const Checkpoint> checkpoint, std::vector<std::string> experts);
  // X.blocks and X.scales of a listed X: encoded from X.weight (one encoding
  // serves both: the scales are kept for the request that follows the
  // blocks). X.weight of a listed X is NotFound (it is not the format asked
  // for). A non-finite BF16 value is refused naming the tensor, the expert
  // and the element (row, column).
  Result<HeldTensor> Get(const std::string& name) override;

 private:
  Status Encode(const std::string& base);

  std::shared_ptr<const Checkpoint> ck_;
  std::vector<std::string> experts_;
  std::string encoded_;  // the base whose encoding is held
  HeldTensor blocks_, scales_;
};

// The bases of the routed-expert stacks in `names` (every X with X.weight
// where X ends in ".ffn.experts.w13" or ".ffn.experts.w2").
std::vector<std::string> RoutedExpertBases(const std::vector<std::string>& names);

}  // namespace moeserve::engine::families

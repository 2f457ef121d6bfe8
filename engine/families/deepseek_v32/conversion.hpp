// The plan of converting a published DeepSeek-V3.2 checkpoint into the
// engine's tensor names and dtypes (model.md 1.1 and 1.2): which engine
// tensors exist, their shapes, and how to make each from the published ones.
// Shared by the loaders (checkpoint.cpp: into memory, or tensor by tensor as
// the model loads) and the writer of a converted directory
// (write_converted.cpp). Internal to the family.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"

namespace moeserve::engine::deepseek_v32::detail {

// An engine tensor made from published ones.
struct Output {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t nbytes() const {
    size_t n = DTypeSize(dtype);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

// One or more outputs made together (an MXFP4 expert stack's blocks and
// scales come from one encoding pass); fill writes outs[i].nbytes() bytes to
// dst[i] (any alignment). When the published bytes already are the outputs
// (an FP8 matrix kept FP8 with its scales, a BF16 matrix as stored),
// `in_place` names them (in_place[i] holds outs[i]'s bytes exactly) and
// `check` verifies them as fill would (no NaN code, positive finite
// scales): a loader may then read them where they are mapped instead of
// having them copied.
struct Recipe {
  std::vector<Output> outs;
  std::function<Status(const std::vector<uint8_t*>& dst)> fill;
  std::vector<const TensorView*> in_place;
  std::function<Status()> check;
};

class Source;  // the published tensors, checked as planned (checkpoint.cpp)

// The published checkpoint and the plan of its conversion (Source and the
// recipes point into `published`: this lives at one address).
struct Conversion {
  Config cfg;  // expert_format set to the format the recipes make
  Checkpoint published;
  std::unique_ptr<Source> src;
  std::vector<Recipe> recipes;
  std::vector<std::string> notes;  // what was skipped, dequantised, requantised
  std::string published_name;      // what converted tensors name as their file in errors
  ~Conversion();
};

// Plans dir's conversion with the routed experts in `experts` (unset: BF16):
// every tensor the config needs checked for presence, dtype and shape, every
// published tensor neither used nor part of an MTP layer refused. Reads no
// tensor data but the block scales of the FP8 matrices converted at load
// (kv_b_proj: BF16 when they are all powers of two, else F32). The other FP8
// matrices are planned FP8, as published, with their "_scale_inv" scales.
// A directory already converted (Config::converted_experts) is refused: it
// needs no conversion.
Result<std::unique_ptr<Conversion>> PlanDir(const std::string& dir, std::optional<ExpertFormat> experts);

}  // namespace moeserve::engine::deepseek_v32::detail

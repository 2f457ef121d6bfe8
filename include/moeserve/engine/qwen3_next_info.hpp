// moe-model-info's view of a Qwen3-Next directory (Hugging Face layout):
// the config parsed and checked, the shards opened, and a summary of layers
// by kind, experts, parameters total, routed and active per token, bytes by
// dtype. Reads headers only; no weights are loaded. A converted directory
// (`publish --experts`) is described as well: its stacked experts counted as
// routed, MXFP4 blocks as two parameters a byte, their scales as none.
#pragma once

#include <string>
#include <string_view>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

Result<std::string> DescribeQwen3Next(const std::string& dir);

// Whether a tensor, published or converted, is a routed expert's.
bool IsQwen3NextRoutedExpert(std::string_view name);
// The parameters a tensor of `elements` elements holds.
double Qwen3NextTensorParameters(std::string_view name, double elements);

}  // namespace moeserve::engine

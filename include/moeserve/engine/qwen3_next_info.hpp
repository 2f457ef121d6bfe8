// moe-model-info's view of a Qwen3-Next directory (Hugging Face layout):
// the config parsed and checked, the shards opened, and a summary of layers
// by kind, experts, parameters total and active per token, bytes by dtype.
// Reads headers only; no weights are loaded.
#pragma once

#include <string>

#include "moeserve/common/status.hpp"

namespace moeserve::engine {

Result<std::string> DescribeQwen3Next(const std::string& dir);

}  // namespace moeserve::engine

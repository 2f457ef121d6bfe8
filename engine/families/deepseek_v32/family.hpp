// The deepseek_v32 entry of the family registry: DeepSeek-V3.2 checkpoints as
// published (families/deepseek_v32.hpp) on the moe-dsa-v1 layer graph.
#pragma once

#include "moeserve/engine/family_registry.hpp"

namespace moeserve::engine {

FamilyEntry DeepseekV32Family();

}  // namespace moeserve::engine

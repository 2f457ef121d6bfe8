// The Qwen3-Next family (Hugging Face model_type "qwen3_next"): its
// checkpoint mapped onto the shared layer graph (graph.hpp) and the ChatML token stream's hooks: stops at
// <|im_end|> and the config's eos ids, reasoning between <think> and
// </think>.
#pragma once

#include "moeserve/engine/family.hpp"
#include "moeserve/engine/family_registry.hpp"

namespace moeserve::engine {

FamilyEntry Qwen3NextFamily();

}  // namespace moeserve::engine

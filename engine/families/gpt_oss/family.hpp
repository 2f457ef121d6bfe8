// The gpt-oss family (gpt_oss_model.hpp): Hugging Face checkpoints with
// model_type "gpt_oss", served with the harmony chat format.
#pragma once

#include "moeserve/engine/family_registry.hpp"

namespace moeserve::engine {

FamilyEntry GptOssFamily();

}  // namespace moeserve::engine

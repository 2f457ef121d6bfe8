// gpt-oss's chat dialect (dialect.hpp): harmony (harmony_request.hpp renders
// it, harmony_arguments.hpp and harmony_structure.hpp constrain it,
// harmony_assembler.hpp reads it).
#pragma once

#include "moeserve/chat/dialect.hpp"
#include "moeserve/chat/gpt_oss/harmony_request.hpp"

namespace moeserve::chat {

// From the engine's harmony tokenizer (the family's chat hooks hold it).
Result<std::shared_ptr<const ChatDialect>> LoadGptOssDialect(const DialectInputs& inputs);
// From a tokenizer and its harmony tokens, without an engine (a turn
// without a reasoning_effort renders at `default_effort`).
std::shared_ptr<const ChatDialect> MakeGptOssDialect(std::shared_ptr<const HarmonyServing> serving,
                                                     ReasoningEffort default_effort);

}  // namespace moeserve::chat

// Qwen3-Next's chat dialect (dialect.hpp): its published ChatML
// (qwen3_request.hpp renders it, qwen3_assembler.hpp reads it).
#pragma once

#include "moeserve/chat/dialect.hpp"

namespace moeserve::chat {

Result<std::shared_ptr<const ChatDialect>> LoadQwen3Dialect(const DialectInputs& inputs);

}  // namespace moeserve::chat

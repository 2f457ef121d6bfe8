// DeepSeek-V3.2's chat dialect (dialect.hpp): its published encoding
// (deepseek_request.hpp renders it, deepseek_assembler.hpp reads it).
#pragma once

#include "moeserve/chat/dialect.hpp"

namespace moeserve::chat {

Result<std::shared_ptr<const ChatDialect>> LoadDeepseekDialect(const DialectInputs& inputs);

}  // namespace moeserve::chat

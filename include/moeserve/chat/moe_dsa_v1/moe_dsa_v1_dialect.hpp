// moe-dsa-v1's chat dialect (dialect.hpp): its own chat format
// (engine/chat_format.hpp), constrained by DecodePolicy, read by OutputAssembler.
#pragma once

#include "moeserve/chat/dialect.hpp"

namespace moeserve::chat {

Result<std::shared_ptr<const ChatDialect>> LoadMoeDsaV1Dialect(const DialectInputs& inputs);

}  // namespace moeserve::chat

// The daemon speaks the chat room's types (include/moeserve/chat/: the chat
// request, API errors, output readers, the family dialects) as its own: they
// are the OpenAI API's vocabulary, which every daemon room shares.
#pragma once

#include "moeserve/chat/api_error.hpp"
#include "moeserve/chat/tool_chain.hpp"
#include "moeserve/chat/chat_request.hpp"
#include "moeserve/chat/dialect.hpp"
#include "moeserve/chat/output_reader.hpp"
#include "moeserve/chat/transcript_entry.hpp"

namespace moeserve::daemon {
using namespace moeserve::chat;
}  // namespace moeserve::daemon

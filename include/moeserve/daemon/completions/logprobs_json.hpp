// choices[].logprobs as OpenAI writes them (docs/http-api.md, "logprobs"):
//   {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
//    "refusal": null}
// for both model families. A token's `bytes` are the bytes it stands for: a
// moe-dsa-v1 byte id its one byte, a gpt-oss id its tokenizer's bytes
// (HfTokenizer::TokenBytes, several for a BPE token), a control token its
// literal text ("<|end|>"). `token` is those bytes as text (TokenText).
// -infinity (a masked-out alternative) is written as -9999, OpenAI's value
// for "too unlikely to say".
//
// Thread safety: functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/hf_tokenizer.hpp"

namespace moeserve::daemon {

// Bytes as OpenAI spells a token: each whole, valid UTF-8 character as
// itself; every other byte (a piece of a character the tokenizer split
// across tokens, or an invalid byte) as the four characters \xNN (lower-case
// hex), so the text is always valid UTF-8 and `bytes` keeps the real bytes.
std::string TokenText(std::string_view bytes);

// tokenizer: gpt-oss's, whose ids are read through it; null for moe-dsa-v1's
// byte-level ids (engine::tok).
nlohmann::json LogprobsJson(const std::vector<ContentLogprob>& tokens, const engine::HfTokenizer* tokenizer);

}  // namespace moeserve::daemon

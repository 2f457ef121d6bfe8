// The moe-dsa-v1 family: the project's own layer graph (Model, model.hpp:
// MLA, DSA, Gated DeltaNet, dense and MoE FFNs) and chat format (<|think|>
// spans, chat_format.hpp).
#pragma once

#include <memory>

#include "moeserve/engine/family.hpp"
#include "moeserve/engine/family_registry.hpp"

namespace moeserve::engine {

FamilyEntry MoeDsaV1Family();

// Stops <|end|> and <|eos|>; reasoning is the span from <|think|> (the
// prompt's, GenerationRequest::starts_in_reasoning) to <|/think|>, which a
// spent thinking budget forces; a fully masked step ends the turn (<|end|>).
std::shared_ptr<const ChatHooks> MoeDsaV1Chat();

}  // namespace moeserve::engine

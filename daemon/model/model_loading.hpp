// The steps of loading the served model (Daemon::LoadModel runs them in
// order): where its files are, the engine's options, and what the chat
// service serves with once the engine runs.
#pragma once

#include <memory>
#include <string>

#include "moeserve/common/status.hpp"
#include "moeserve/daemon/completions/chat_service.hpp"
#include "moeserve/daemon/config.hpp"
#include "moeserve/daemon/image/image_work.hpp"
#include "moeserve/daemon/model/readiness.hpp"
#include "moeserve/engine/engine.hpp"
#include "moeserve/storage/weight_puller.hpp"

namespace moeserve::daemon {

// The model's directory: the configured path, or, for a URI, a pull into
// the node-local cache (reported on `readiness`); `pulled` then holds the
// lease that keeps the model from eviction.
Result<std::string> ResolveModelDir(const DaemonConfig& config, Readiness& readiness,
                                    std::unique_ptr<storage::PulledModel>& pulled);

// The engine's options from the daemon's configuration (expert-parallel
// rank and world left for the caller).
engine::EngineOptions EngineOptionsFrom(const DaemonConfig& config);

// The pool's size: the configured cache_tokens, or, unset, a memory budget
// (EngineOptions::cache_memory_bytes) of cache_memory_share of the machine's
// free memory less the model directory's bytes, logged. Under expert
// parallelism an unset cache_tokens is the engine's default on every rank.
void SizeCacheFromMemory(const DaemonConfig& config, const std::string& model_dir, bool expert_parallel,
                         engine::EngineOptions& o);

// What the chat service serves `family`'s model with: the configuration's
// limits, the engine's context, the family's chat dialect (chosen here, the
// one place the daemon decides the family), its budgets and public prefix.
Result<ServingFacts> ServingFactsFor(const DaemonConfig& config, engine::Engine& engine, const std::string& family,
                                     const std::string& model_dir, ImageWork* image_work);

}  // namespace moeserve::daemon

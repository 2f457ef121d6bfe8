#include "model/model_loading.hpp"

#include <cstdio>

#include "model/machine_memory.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/engine/context_bytes.hpp"

namespace moeserve::daemon {

Result<std::string> ResolveModelDir(const DaemonConfig& config, Readiness& readiness,
                                    std::unique_ptr<storage::PulledModel>& pulled) {
  if (config.model.find("://") == std::string::npos) return config.model;
  // A URI: pull into the node-local cache first; /readyz reports the pull.
  storage::PullOptions po;
  po.revision = config.model_revision;
  po.connections = config.pull_connections;
  po.source.endpoint_url = config.storage_endpoint;
  po.source.region = config.storage_region;
  po.source.ca_file = config.storage_ca_file;
  po.on_progress = [&readiness](const storage::PullProgress& p) { readiness.Set("pulling", p.ToLogLine()); };
  readiness.Set("pulling", config.model + " @ " + config.model_revision);
  storage::WeightPuller puller(
      storage::CacheConfig{config.weights_cache, static_cast<uint64_t>(config.weights_cache_limit_bytes)});
  auto got = puller.Pull(config.model, po);
  if (!got) {
    readiness.Set("failed", got.error().message());
    return Fail(got.error().WithContext("pulling model " + config.model));
  }
  std::string dir = got->dir;
  pulled = std::make_unique<storage::PulledModel>(std::move(*got));
  return dir;
}

engine::EngineOptions EngineOptionsFrom(const DaemonConfig& config) {
  engine::EngineOptions o;
  o.max_running = config.max_running;
  o.max_waiting = config.max_queue;
  o.prefill_chunk_tokens = config.prefill_chunk_tokens;
  o.prefill_chunk_tokens_idle = config.prefill_chunk_tokens_idle;
  // Unset (0): the engine's default until SizeCacheFromMemory sizes it.
  o.cache_tokens = config.cache_tokens > 0 ? config.cache_tokens : engine::EngineOptions{}.cache_tokens;
  o.block_tokens = config.block_tokens;
  o.prefix_cache = config.prefix_cache;
  o.prefix_cache_bytes = config.prefix_cache_bytes;
  o.prefix_disk_dir = config.prefix_disk_dir;
  o.prefix_disk_bytes = config.prefix_disk_bytes;
  o.prefix_disk_max_age_seconds = config.prefix_disk_max_age_seconds;
  o.prefix_pin_share = config.sessions.pin_share;
  o.kernels = config.kernels == "reference" ? engine::KernelChoice::kReference : engine::KernelChoice::kFast;
  o.deterministic = config.deterministic;
  o.bf16_activations = config.bf16_activations;
  o.indexer_scores = config.indexer_scores == "int8" ? engine::IndexerScores::kInt8 : engine::IndexerScores::kExact;
  o.speculative = config.speculative;
  o.draft_tokens = config.draft_tokens;
  o.speculative_max_batch = config.speculative_max_batch;
  if (config.experts != "stored")
    o.experts = config.experts == "mxfp4" ? engine::ExpertFormat::kMxfp4 : engine::ExpertFormat::kBf16;
  o.threads = config.threads;
  o.max_context = config.max_context;
  return o;
}

void SizeCacheFromMemory(const DaemonConfig& config, const std::string& model_dir, bool expert_parallel,
                         engine::EngineOptions& o) {
  if (config.cache_tokens > 0) {
    o.cache_tokens = config.cache_tokens;  // an explicit setting wins
    return;
  }
  if (expert_parallel) {  // every rank's pool must have rank 0's size, whatever each machine has free
    o.cache_tokens = engine::EngineOptions{}.cache_tokens;
    log::Info("moe-daemon: cache_tokens unset under expert parallelism: " + std::to_string(o.cache_tokens) +
              " tokens on every rank (set cache_tokens to size the pool)");
    return;
  }
  const MachineMemory memory = ReadMachineMemory();
  const int64_t weights = DirectoryBytes(model_dir);
  if (memory.available <= 0) {
    o.cache_tokens = engine::EngineOptions{}.cache_tokens;
    log::Warn("moe-daemon: free memory could not be read; cache_tokens " + std::to_string(o.cache_tokens));
    return;
  }
  o.cache_tokens = 0;
  o.cache_memory_bytes = CacheMemoryBudget(memory.available, weights, config.cache_memory_share);
  char share[32];
  std::snprintf(share, sizeof share, "%g", config.cache_memory_share);
  log::Info("moe-daemon: cache_tokens unset: the KV pool gets " + engine::HumanBytes(o.cache_memory_bytes) + " (" +
            share + " of " + engine::HumanBytes(memory.available) + " free by " +
            memory.source + " less " + engine::HumanBytes(weights) + " of model files)");
}

Result<ServingFacts> ServingFactsFor(const DaemonConfig& config, engine::Engine& engine, const std::string& family,
                                     const std::string& model_dir, ImageWork* image_work) {
  MOE_ASSIGN_OR_RETURN(std::shared_ptr<const ChatDialect> dialect,
                       chat::LoadDialect(family, chat::DialectInputs{model_dir, &engine, config.default_reasoning_effort}));
  ServingFacts facts;
  facts.model_name = config.served_model_name;
  facts.max_context = engine.max_context();
  facts.default_max_tokens = config.default_max_tokens;
  facts.default_effort = config.default_reasoning_effort;
  facts.constrained_max_string_bytes = config.constrained_max_string_bytes;
  facts.images = config.images;
  facts.image_work = image_work;
  facts.vision = dialect->vision();
  // The tiers bound reasoning as configured, else as the family says.
  facts.budgets = config.thinking_budgets.value_or(dialect->DefaultBudgets());
  if (!config.public_system_prompt.empty()) {
    auto prefix = dialect->PublicPrefix(config.public_system_prompt);
    if (!prefix) return Fail(prefix.error().WithContext("rendering public_system_prompt"));
    facts.public_prefix = std::move(*prefix);
  }
  facts.dialect = std::move(dialect);
  return facts;
}

}  // namespace moeserve::daemon

#include "moeserve/daemon/model/expert_parallel.hpp"

#include <algorithm>
#include <mutex>

#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/kv_pool.hpp"
#include "moeserve/engine/model.hpp"
#include "moeserve/kernels/thread_pool.hpp"

namespace moeserve::daemon {

struct ExpertParallel::Impl {
  engine::ExpertGroupSettings settings;
  std::unique_ptr<engine::Model> model;  // followers only
  std::unique_ptr<engine::KvPool> pool;  // followers only
  std::unique_ptr<engine::ExpertGroup> group;

  prometheus::Gauge* world = nullptr;
  prometheus::Gauge* rank = nullptr;
  prometheus::Gauge* connected = nullptr;
  prometheus::Gauge* degraded = nullptr;
  prometheus::Counter* formations = nullptr;
  prometheus::Counter* failures = nullptr;
  prometheus::Family<prometheus::Counter>* rank_tokens = nullptr;
  prometheus::Gauge* imbalance = nullptr;
  prometheus::Gauge* routed_bytes = nullptr;

  std::mutex mu;  // guards the last-seen totals
  uint64_t last_formations = 0, last_failures = 0;
  std::vector<uint64_t> last_rank_tokens;

  void Register(DaemonMetrics& metrics, const engine::Model& held) {
    auto& reg = metrics.registry();
    auto gauge = [&](const char* name, const char* help) {
      return &prometheus::BuildGauge().Name(name).Help(help).Register(reg).Add({});
    };
    auto counter = [&](const char* name, const char* help) {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(reg).Add({});
    };
    world = gauge("moe_ep_world_size", "Ranks in this pod's expert-parallel group");
    rank = gauge("moe_ep_rank", "This pod's expert-parallel rank");
    connected = gauge("moe_ep_group_connected", "1 while every rank of the group is connected");
    degraded = gauge("moe_ep_group_degraded", "1 after a rank was lost, until the group is whole again");
    formations = counter("moe_ep_group_formations_total", "Times the expert-parallel group connected");
    failures = counter("moe_ep_group_failures_total", "Times the expert-parallel group broke (a rank died or timed out)");
    routed_bytes = gauge("moe_ep_routed_expert_bytes",
                         "Bytes of routed-expert weights this rank holds (its slice: 1/world of the model's)");
    world->Set(settings.world);
    rank->Set(settings.rank);
    routed_bytes->Set(static_cast<double>(held.routed_expert_bytes()));
    if (settings.rank == 0) {
      rank_tokens = &prometheus::BuildCounter()
                         .Name("moe_expert_rank_tokens_total")
                         .Help("(token, expert) pairs routed to each rank's experts, all MoE layers")
                         .Register(reg);
      imbalance = gauge("moe_expert_rank_load_imbalance",
                        "Routed pairs of the busiest rank over the mean of all ranks since start (1 = balanced)");
      last_rank_tokens.assign(static_cast<size_t>(settings.world), 0);
    }
  }

  void OnStatus(const engine::ExpertGroupStatus& s) {
    connected->Set(s.state == engine::ExpertGroupStatus::State::kConnected ? 1 : 0);
    degraded->Set(s.state == engine::ExpertGroupStatus::State::kDegraded ? 1 : 0);
    std::lock_guard<std::mutex> lock(mu);
    if (s.formations > last_formations) formations->Increment(static_cast<double>(s.formations - last_formations));
    if (s.failures > last_failures) failures->Increment(static_cast<double>(s.failures - last_failures));
    last_formations = s.formations;
    last_failures = s.failures;
  }
};

namespace {

void SetReadiness(Readiness& readiness, const engine::ExpertGroupStatus& s, int rank, int world) {
  using State = engine::ExpertGroupStatus::State;
  const std::string who = "expert-parallel rank " + std::to_string(rank) + " of " + std::to_string(world);
  switch (s.state) {
    case State::kConnected: readiness.Set("ready", who + ": " + s.detail); break;
    case State::kJoining: readiness.Set("joining", who + ": " + s.detail); break;
    case State::kDegraded: readiness.Set("degraded", who + ": " + s.detail); break;
    case State::kStopped: readiness.Set("draining", who); break;
  }
}

}  // namespace

ExpertParallel::ExpertParallel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExpertParallel::~ExpertParallel() { Stop(); }

void ExpertParallel::Stop() {
  if (impl_->group) impl_->group->Stop();
}

Result<std::unique_ptr<ExpertParallel>> ExpertParallel::Lead(const engine::ExpertGroupSettings& settings,
                                                             const engine::Engine& engine, Readiness& readiness,
                                                             std::atomic<bool>& serving, DaemonMetrics& metrics) {
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  if (!engine.model()) return Fail(Error::InvalidArgument("expert parallelism needs a model on the shared layer graph"));
  impl->Register(metrics, *engine.model());
  Impl* p = impl.get();
  auto listener = [p, &readiness, &serving, settings](const engine::ExpertGroupStatus& s) {
    p->OnStatus(s);
    serving.store(s.state == engine::ExpertGroupStatus::State::kConnected);
    SetReadiness(readiness, s, settings.rank, settings.world);
  };
  MOE_ASSIGN_OR_RETURN(impl->group, engine::ExpertGroup::Lead(settings, *engine.model(), listener));
  return std::unique_ptr<ExpertParallel>(new ExpertParallel(std::move(impl)));
}

Result<std::unique_ptr<ExpertParallel>> ExpertParallel::Follow(const engine::ExpertGroupSettings& settings,
                                                               const std::string& model_dir, const engine::EngineOptions& o,
                                                               Readiness& readiness, DaemonMetrics& metrics) {
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  kernels::RequestDefaultThreadPoolSize(o.threads);
  // Rank 0's model options (its engine's), this rank's slice.
  engine::ModelOptions mo = engine::ModelOptionsFor(o);
  mo.ep_rank = settings.rank;
  mo.ep_world = settings.world;
  MOE_ASSIGN_OR_RETURN(impl->model, engine::LoadLayerGraph(model_dir, mo));
  if (o.block_tokens <= 0 || o.cache_tokens < o.block_tokens)
    return Fail(Error::InvalidArgument("engine options: block_tokens and cache_tokens must be positive"));
  try {
    impl->pool = std::make_unique<engine::KvPool>(o.cache_tokens / o.block_tokens, o.block_tokens,
                                                  impl->model->cache_floats_per_token(), impl->model->cache_stripes());
  } catch (const std::bad_alloc&) {
    return Fail(Error::ResourceExhausted("KV cache pool of " + std::to_string(o.cache_tokens) + " tokens could not be allocated"));
  }
  impl->Register(metrics, *impl->model);
  Impl* p = impl.get();
  auto listener = [p, &readiness, settings](const engine::ExpertGroupStatus& s) {
    p->OnStatus(s);
    SetReadiness(readiness, s, settings.rank, settings.world);
  };
  MOE_ASSIGN_OR_RETURN(impl->group, engine::ExpertGroup::Follow(settings, *impl->model, *impl->pool, listener));
  return std::unique_ptr<ExpertParallel>(new ExpertParallel(std::move(impl)));
}

void ExpertParallel::RefreshMetrics(const engine::EngineMetrics* m) {
  if (!m || !impl_->rank_tokens) return;
  const int W = impl_->settings.world;
  std::vector<uint64_t> per_rank(static_cast<size_t>(W), 0);
  for (const auto& layer : m->expert_tokens) {
    if (layer.empty()) continue;
    const size_t per = layer.size() / static_cast<size_t>(W);
    for (size_t e = 0; e < layer.size(); ++e) per_rank[std::min(e / per, per_rank.size() - 1)] += layer[e];
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  uint64_t total = 0, busiest = 0;
  for (int r = 0; r < W; ++r) {
    const uint64_t now = per_rank[static_cast<size_t>(r)];
    uint64_t& last = impl_->last_rank_tokens[static_cast<size_t>(r)];
    if (now > last) impl_->rank_tokens->Add({{"rank", std::to_string(r)}}).Increment(static_cast<double>(now - last));
    else impl_->rank_tokens->Add({{"rank", std::to_string(r)}});
    last = std::max(last, now);
    total += now;
    busiest = std::max(busiest, now);
  }
  impl_->imbalance->Set(total > 0 ? static_cast<double>(busiest) * W / static_cast<double>(total) : 1.0);
}

}  // namespace moeserve::daemon

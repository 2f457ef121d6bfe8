#include "moeserve/operator/operator.hpp"

#include <chrono>

#include <cpprest/http_listener.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "moeserve/common/log.hpp"
#include "moeserve/operator/vault_paths.hpp"

namespace moeserve::op {

namespace http = web::http;

struct Operator::Metrics {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& reconcile_total =
      prometheus::BuildCounter().Name("moe_operator_reconcile_total").Help("Reconciles by result").Register(*registry);
  prometheus::Family<prometheus::Counter>& reconcile_errors =
      prometheus::BuildCounter().Name("moe_operator_reconcile_errors_total").Help("Reconciles that failed and were requeued").Register(*registry);
  prometheus::Family<prometheus::Histogram>& reconcile_duration =
      prometheus::BuildHistogram().Name("moe_operator_reconcile_duration_seconds").Help("Time per reconcile").Register(*registry);
  prometheus::Family<prometheus::Gauge>& queue_depth =
      prometheus::BuildGauge().Name("moe_operator_workqueue_depth").Help("Keys waiting in the work queue").Register(*registry);
  prometheus::Family<prometheus::Gauge>& leader =
      prometheus::BuildGauge().Name("moe_operator_leader").Help("1 while this replica holds the lease").Register(*registry);
  prometheus::Counter& success = reconcile_total.Add({{"controller", "moedeployment"}, {"result", "success"}});
  prometheus::Counter& error = reconcile_total.Add({{"controller", "moedeployment"}, {"result", "error"}});
  prometheus::Counter& errors = reconcile_errors.Add({{"controller", "moedeployment"}});
  prometheus::Histogram& duration = reconcile_duration.Add(
      {{"controller", "moedeployment"}},
      prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  prometheus::Gauge& depth = queue_depth.Add({{"name", "moedeployment"}});
  prometheus::Gauge& is_leader = leader.Add({});
  // The usage sync (usage_sync.hpp), brought up to date at each scrape.
  prometheus::Counter& usage_syncs = prometheus::BuildCounter()
                                         .Name("moe_operator_usage_syncs_total")
                                         .Help("QuotaPolicy usage syncs committed")
                                         .Register(*registry)
                                         .Add({});
  prometheus::Family<prometheus::Counter>& usage_pod_reads =
      prometheus::BuildCounter().Name("moe_operator_usage_pod_reads_total").Help("Daemon /v1/usage reads by result").Register(*registry);
  prometheus::Counter& pod_reads_ok = usage_pod_reads.Add({{"result", "ok"}});
  prometheus::Counter& pod_reads_failed = usage_pod_reads.Add({{"result", "failed"}});
  prometheus::Family<prometheus::Counter>& deliveries =
      prometheus::BuildCounter().Name("moe_operator_alert_deliveries_total").Help("Budget alert posts by result").Register(*registry);
  prometheus::Counter& delivered = deliveries.Add({{"result", "delivered"}});
  prometheus::Counter& delivery_failed = deliveries.Add({{"result", "failed"}});
  prometheus::Gauge& usage_sync_seconds = prometheus::BuildGauge()
                                              .Name("moe_operator_usage_sync_duration_seconds")
                                              .Help("How long the last usage sync of every QuotaPolicy took")
                                              .Register(*registry)
                                              .Add({});
  void Update(const UsageSyncStats& s) {
    auto to = [](prometheus::Counter& c, uint64_t v) {
      if (static_cast<double>(v) > c.Value()) c.Increment(static_cast<double>(v) - c.Value());
    };
    to(usage_syncs, s.syncs);
    to(pod_reads_ok, s.pods_read);
    to(pod_reads_failed, s.pods_failed);
    to(delivered, s.deliveries);
    to(delivery_failed, s.delivery_failures);
    usage_sync_seconds.Set(s.last_sync_seconds);
  }
  // The autoscaler (autoscaler.hpp).
  prometheus::Family<prometheus::Counter>& autoscale_decisions =
      prometheus::BuildCounter()
          .Name("moe_operator_autoscaler_decisions_total")
          .Help("Autoscaler decisions by outcome (hold, scale_up, scale_down)")
          .Register(*registry);
  prometheus::Counter& decided_hold = autoscale_decisions.Add({{"outcome", "hold"}});
  prometheus::Counter& decided_up = autoscale_decisions.Add({{"outcome", "scale_up"}});
  prometheus::Counter& decided_down = autoscale_decisions.Add({{"outcome", "scale_down"}});
  prometheus::Family<prometheus::Counter>& autoscale_errors =
      prometheus::BuildCounter()
          .Name("moe_operator_autoscaler_errors_total")
          .Help("Autoscaler failures by kind (refused: the scale write was refused, e.g. by quota; write: another "
                "write error; metrics_read: a daemon's /metrics could not be read)")
          .Register(*registry);
  prometheus::Counter& refused = autoscale_errors.Add({{"kind", "refused"}});
  prometheus::Counter& write_errors = autoscale_errors.Add({{"kind", "write"}});
  prometheus::Counter& metrics_reads_failed = autoscale_errors.Add({{"kind", "metrics_read"}});
  prometheus::Family<prometheus::Gauge>& autoscale_current =
      prometheus::BuildGauge()
          .Name("moe_operator_autoscaler_current_replicas")
          .Help("spec.replicas of each autoscaled MoEDeployment, last interval")
          .Register(*registry);
  prometheus::Family<prometheus::Gauge>& autoscale_desired =
      prometheus::BuildGauge()
          .Name("moe_operator_autoscaler_desired_replicas")
          .Help("Replica groups the autoscaler wanted for each MoEDeployment, last interval")
          .Register(*registry);
  void Update(const AutoscalerStats& s) {
    auto to = [](prometheus::Counter& c, uint64_t v) {
      if (static_cast<double>(v) > c.Value()) c.Increment(static_cast<double>(v) - c.Value());
    };
    to(decided_up, s.scale_ups);
    to(decided_down, s.scale_downs);
    to(decided_hold, s.decisions - std::min(s.decisions, s.scale_ups + s.scale_downs));
    to(refused, s.refusals);
    to(write_errors, s.errors);
    to(metrics_reads_failed, s.pods_failed);
    for (const auto& [key, counts] : s.replicas) {
      const auto slash = key.find('/');
      const std::map<std::string, std::string> labels = {{"namespace", key.substr(0, slash)},
                                                          {"moedeployment", key.substr(slash + 1)}};
      autoscale_current.Add(labels).Set(counts.first);
      autoscale_desired.Add(labels).Set(counts.second);
    }
  }
};

struct Operator::Servers {
  std::unique_ptr<http::experimental::listener::http_listener> metrics, health;
  ~Servers() {
    for (auto* l : {metrics.get(), health.get()})
      if (l) try {
          l->close().wait();
        } catch (...) {
        }
  }
};

std::string ListenUri(const std::string& addr) {
  if (addr.empty() || addr == "0") return "";
  std::string a = addr;
  if (a[0] == ':') a = "0.0.0.0" + a;
  return "http://" + a;
}

Operator::Operator(KubeClient& client, OperatorOptions options)
    : client_(client), options_(std::move(options)), queue_(options_.rate_limits), metrics_(std::make_unique<Metrics>()) {
  events_ = std::make_unique<EventRecorder>(client_, "moe-operator");
  // --watch-namespace: every informer (MoEDeployments, QuotaPolicies,
  // children) keeps only those namespaces, so nothing here reads a Secret
  // or a pod elsewhere (the chart grants both there alone).
  options_.informer.namespaces = options_.watch_namespaces;
  // The hook keys' Vault prefix is no MoEDeployment's to name: the webhook refuses it too.
  options_.webhook.reserved_vault_prefix = options_.hook_secrets.vault_prefix;
  // Nor is the role the hook keys are read with (Vault's binding refuses it too).
  options_.webhook.reserved_vault_role = options_.hook_secrets.vault_role;
  auto enqueue = [this](const json& o) {
    queue_.Add(ObjectKey(o));
    metrics_->depth.Set(static_cast<double>(queue_.Len()));
  };
  InformerHandlers md_handlers;
  // Quota ties a namespace's MoEDeployments together: a change of demand re-judges the others.
  md_handlers.on_add = [this, enqueue](const json& o) {
    enqueue(o);
    quota_->OnMoEDeployment(o);
  };
  md_handlers.on_update = [this, enqueue](const json& old, const json& o) {
    enqueue(o);
    if (old.value("spec", json()) != o.value("spec", json()) ||
        old["metadata"].contains("deletionTimestamp") != o["metadata"].contains("deletionTimestamp"))
      quota_->OnMoEDeployment(o);
  };
  md_handlers.on_delete = [this, enqueue](const json& o) {
    enqueue(o);
    quota_->OnMoEDeployment(o);
  };
  auto md = std::make_unique<Informer>(client_, resources::kMoEDeployment, options_.watch_namespace, options_.informer,
                                       md_handlers);
  md_informer_ = md.get();
  informers_.push_back(std::move(md));
  quota_ = std::make_unique<QuotaController>(client_, options_.watch_namespace, options_.informer, options_.webhook,
                                             options_.reconciler.platform.scheduling, md_informer_->cache(), [this](const std::string& key) {
                                               queue_.Add(key);
                                               metrics_->depth.Set(static_cast<double>(queue_.Len()));
                                             });
  if (!options_.reconciler.quota) options_.reconciler.quota = quota_->Check();
  if (!options_.reconciler.vault_path_allowed)
    options_.reconciler.vault_path_allowed = [q = quota_.get(), reserved = options_.hook_secrets.vault_prefix,
                                              hook_role = options_.hook_secrets.vault_role](
                                                 const json& md, const std::string& field, const std::string& path) -> Status {
      const std::string ns = md["metadata"].value("namespace", "");
      MOE_TRY(CheckDeploymentVaultRole(md, hook_role));
      return CheckDeploymentVaultPath(md, field, path, q->policies().List(ns), reserved);
    };
  if (!options_.reconciler.budgeting)
    options_.reconciler.budgeting = [q = quota_.get()](const json& md) { return q->BudgetingOf(md); };
  // Children: only what this operator manages, mapped back to their owner.
  InformerOptions child_options = options_.informer;
  child_options.label_selector = std::string("app.kubernetes.io/managed-by=") + kManagedBy;
  InformerHandlers child_handlers;
  child_handlers.on_add = [this](const json& o) { EnqueueOwner(o); };
  child_handlers.on_update = [this](const json&, const json& o) { EnqueueOwner(o); };
  child_handlers.on_delete = [this](const json& o) { EnqueueOwner(o); };
  ReconcilerCaches caches;
  caches.moedeployments = &md_informer_->mutable_cache();
  // Secrets are not watched: the operator reads the ones it needs by name
  // (RBAC cannot narrow a list or watch of Secrets to a label, so it is
  // granted neither); secret_cache_ holds what the reconciler last read or wrote.
  caches.secrets = &secret_cache_;
  for (const ResourceRef* ref : {&resources::kStatefulSet, &resources::kService, &resources::kConfigMap,
                                 &resources::kPodDisruptionBudget,
                                 &resources::kPersistentVolumeClaim, &resources::kPersistentVolume,
                                 &resources::kNetworkPolicy}) {
    // PersistentVolumes are cluster-scoped: watched everywhere, mapped back
    // by their owner labels; not at all when a storage class provides them.
    if (ref == &resources::kPersistentVolume && !options_.reconciler.platform.cache_storage_class.empty()) continue;
    const std::string ns = ref->namespaced ? options_.watch_namespace : "";
    auto informer = std::make_unique<Informer>(client_, *ref, ns, child_options, child_handlers);
    ObjectCache* cache = &informer->mutable_cache();
    if (ref == &resources::kStatefulSet) caches.statefulsets = cache;
    if (ref == &resources::kService) caches.services = cache;
    if (ref == &resources::kConfigMap) caches.configmaps = cache;
    if (ref == &resources::kPodDisruptionBudget) caches.pdbs = cache;
    if (ref == &resources::kPersistentVolumeClaim) caches.claims = cache;
    if (ref == &resources::kPersistentVolume) caches.volumes = cache;
    if (ref == &resources::kNetworkPolicy) caches.networkpolicies = cache;
    informers_.push_back(std::move(informer));
  }
  informers_.push_back(quota_->TakeInformer());
  // Admin keys live where the webhook's Secret does: the operator's own namespace.
  options_.reconciler.operator_namespace = options_.webhook.operator_namespace;
  reconciler_ = std::make_unique<MoEDeploymentReconciler>(client_, caches, events_.get(), options_.reconciler);
  // Hook keys are the platform's: read from the operator's namespace, or
  // from Vault as the operator itself, never as a tenant's namespace.
  options_.hook_secrets.operator_namespace = options_.webhook.operator_namespace;
  hook_secret_source_ = std::make_unique<HookSecretSource>(client_, options_.hook_vault, options_.hook_secrets);
  SecretSource* hook_secrets = hook_secret_source_.get();
  // Budget records live where the webhook's Secret does: the operator's own namespace.
  options_.usage_sync.record_namespace = options_.webhook.operator_namespace;
  usage_sync_ = std::make_unique<UsageSync>(
      client_, UsageSync::Caches{&quota_->policies(), &md_informer_->cache(), caches.statefulsets, caches.secrets},
      *hook_secrets, options_.usage_sync);
  autoscaler_ = std::make_unique<Autoscaler>(
      client_, Autoscaler::Caches{&md_informer_->cache(), caches.statefulsets, caches.secrets}, events_.get(),
      options_.autoscaler);
}

Operator::~Operator() {
  RequestStop();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
}

const ObjectCache& Operator::moedeployments() const { return md_informer_->cache(); }

bool Operator::Synced() const {
  for (const auto& i : informers_)
    if (!i->HasSynced()) return false;
  return true;
}

void Operator::RequestStop() {
  stop_ = true;
  queue_.ShutDown();
}

void Operator::EnqueueOwner(const json& object) {
  // Any object may carry our labels: malformed metadata is skipped, never fatal.
  const json meta = object.is_object() ? object.value("metadata", json::object()) : json::object();
  if (!meta.is_object()) return;
  const json refs = meta.value("ownerReferences", json::array());
  const std::string ns = meta.value("namespace", json("")).is_string() ? meta.value("namespace", "") : "";
  bool owned = false;
  if (refs.is_array())
    for (const auto& ref : refs) {
      if (!ref.is_object() || !ref.value("name", json()).is_string() || !ref.value("kind", json()).is_string()) continue;
      if (ref.value("kind", "") != "MoEDeployment" || ref.value("controller", json()) != json(true)) continue;
      queue_.Add(ns + "/" + ref.value("name", ""));
      owned = true;
    }
  // A cluster-scoped child (the cache volume) names its owner in labels.
  const json labels = meta.value("labels", json::object());
  if (!owned && labels.is_object() && labels.value(kOwnerNamespaceLabel, json()).is_string() &&
      labels.value(kOwnerNameLabel, json()).is_string())
    queue_.Add(labels.value(kOwnerNamespaceLabel, "") + "/" + labels.value(kOwnerNameLabel, ""));
  metrics_->depth.Set(static_cast<double>(queue_.Len()));
}

void Operator::Worker() {
  while (auto key = queue_.Get()) {
    metrics_->depth.Set(static_cast<double>(queue_.Len()));
    const auto start = std::chrono::steady_clock::now();
    // The worker boundary, as controller-runtime recovers panics: one bad
    // object fails its own reconcile (requeued with backoff), never the process.
    Result<ReconcileResult> result = Fail(Error::Internal("reconcile did not run"));
    try {
      result = QuotaController::IsPolicyKey(*key) ? quota_->Reconcile(*key) : reconciler_->Reconcile(*key);
    } catch (const std::exception& e) {
      result = Fail(Error::Internal(std::string("reconcile threw: ") + e.what()));
    } catch (...) {
      result = Fail(Error::Internal("reconcile threw a non-standard exception"));
    }
    metrics_->duration.Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    reconciles_++;
    if (!result) {
      reconcile_errors_++;
      metrics_->error.Increment();
      metrics_->errors.Increment();
      // A conflict is the normal price of optimistic concurrency: retry quietly.
      if (result.error().code() == ErrorCode::kConflict)
        log::Debug("reconcile " + *key + ": " + result.error().ToString());
      else
        log::Warn("reconcile " + *key + ": " + result.error().ToString());
      queue_.AddRateLimited(*key);
    } else {
      metrics_->success.Increment();
      queue_.Forget(*key);
      if (result->requeue_after.count() > 0) queue_.AddAfter(*key, result->requeue_after);
    }
    queue_.Done(*key);
  }
}

void Operator::StartWorkers() {
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { Worker(); });
}

Status Operator::Run() {
  // 1. Caches first, on every replica, so a new leader starts warm.
  for (auto& i : informers_) i->Start();

  // 2. Metrics and health.
  servers_ = std::make_unique<Servers>();
  try {
    if (auto uri = ListenUri(options_.metrics_addr); !uri.empty()) {
      servers_->metrics = std::make_unique<http::experimental::listener::http_listener>(uri);
      servers_->metrics->support(http::methods::GET, [this](http::http_request req) {
        if (req.relative_uri().path() != "/metrics") return (void)req.reply(http::status_codes::NotFound);
        metrics_->depth.Set(static_cast<double>(queue_.Len()));
        metrics_->is_leader.Set(leading_ ? 1 : 0);
        metrics_->Update(usage_sync_->stats());
        metrics_->Update(autoscaler_->stats());
        http::http_response resp(http::status_codes::OK);
        resp.set_body(prometheus::TextSerializer().Serialize(metrics_->registry->Collect()),
                      "text/plain; version=0.0.4");
        req.reply(resp);
      });
      servers_->metrics->open().wait();
    }
    if (auto uri = ListenUri(options_.health_addr); !uri.empty()) {
      servers_->health = std::make_unique<http::experimental::listener::http_listener>(uri);
      servers_->health->support(http::methods::GET, [this](http::http_request req) {
        const std::string path = req.relative_uri().path();
        if (path == "/healthz") return (void)req.reply(http::status_codes::OK, "ok");
        if (path == "/readyz")
          return (void)req.reply(Synced() ? http::status_codes::OK : http::status_codes::ServiceUnavailable,
                                 Synced() ? "ok" : "caches not synced");
        req.reply(http::status_codes::NotFound);
      });
      servers_->health->open().wait();
    }
  } catch (const std::exception& e) {
    RequestStop();
    client_.CancelWatches();
    for (auto& i : informers_) i->Stop();
    return Fail(Error::Unavailable(std::string("metrics/health listener: ") + e.what()));
  }

  // 3. Wait for the caches, then work (while leading, when electing).
  while (!stop_ && !Synced()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The quota webhook decides from the caches: it serves once they are
  // synced, on every replica, leading or not.
  if (auto webhook = stop_ ? Ok() : quota_->StartWebhook(); !webhook) {
    RequestStop();
    client_.CancelWatches();
    for (auto& i : informers_) i->Stop();
    servers_.reset();
    return Fail(webhook.error());
  }
  std::thread elector_thread;
  std::unique_ptr<LeaderElector> elector;
  if (options_.leader_elect) {
    // Every call made while leading ends before the renew deadline, and no
    // write leaves once it has passed (the Lease itself excepted: renewing it
    // is how leading goes on).
    LeaderElectionOptions election = options_.election;
    client_.LimitRequestTimeout(election.renew_deadline / 2);
    election.fence = std::make_shared<WriteFence>();
    client_.SetWriteFence(election.fence, resources::kLease.Path(election.lease_namespace));
    elector = std::make_unique<LeaderElector>(client_, election);
    elector_thread = std::thread([&] {
      elector->Run(
          stop_,
          [&] {
            std::lock_guard lock(leadership_mu_);
            if (stop_) return;  // shutdown has begun (or is about to join what this would start)
            leading_ = true;
            metrics_->is_leader.Set(1);
            quota_->SetLeading(true);
            StartWorkers();
            usage_sync_->Start();
            autoscaler_->Start();
          },
          [&] {
            std::lock_guard lock(leadership_mu_);
            leading_ = false;
            metrics_->is_leader.Set(0);
            quota_->SetLeading(false);
            usage_sync_->Stop();
            autoscaler_->Stop();
            if (!stop_) {
              lost_leadership_ = true;
              RequestStop();
            }
          });
    });
  } else if (!stop_) {
    leading_ = true;
    quota_->SetLeading(true);
    StartWorkers();
    usage_sync_->Start();
    autoscaler_->Start();
  }
  while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(20));

  // 4. Shut down: workers finish their key, watches end, the lease is released.
  // Under the lock, stop_ is already set: a leadership callback either ran
  // before (and what it started is joined here) or sees stop_ and starts nothing.
  {
    std::lock_guard lock(leadership_mu_);
    queue_.ShutDown();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
    usage_sync_->Stop();
    autoscaler_->Stop();
  }
  if (elector_thread.joinable()) elector_thread.join();
  quota_->Stop();
  client_.CancelWatches();
  for (auto& i : informers_) i->Stop();
  servers_.reset();
  if (lost_leadership_) return Fail(Error::Unavailable("leader election lost; exiting so a fresh process can rejoin"));
  return Ok();
}

}  // namespace moeserve::op

#include "moeserve/operator/quota_controller.hpp"

#include "moeserve/common/log.hpp"

namespace moeserve::op {
namespace {

std::string NamespaceOf(const json& o) {
  const json meta = o.is_object() ? o.value("metadata", json::object()) : json::object();
  return meta.is_object() && meta.value("namespace", json()).is_string() ? meta.value("namespace", "") : "";
}

}  // namespace

QuotaController::QuotaController(KubeClient& client, const std::string& watch_namespace,
                                 const InformerOptions& informer, WebhookOptions webhook,
                                 SchedulingPolicy scheduling, const ObjectCache& moedeployments,
                                 std::function<void(const std::string&)> enqueue)
    : client_(client), webhook_options_(std::move(webhook)), moedeployments_(moedeployments), enqueue_(std::move(enqueue)) {
  InformerHandlers handlers;
  // A policy change re-judges its namespace.
  auto changed = [this](const json& policy) {
    enqueue_(kQuotaPolicyKeyPrefix + ObjectKey(policy));
    const std::string ns = NamespaceOf(policy);
    for (const auto& md : moedeployments_.List(ns)) enqueue_(ObjectKey(md));
  };
  handlers.on_add = changed;
  handlers.on_update = [changed](const json& old, const json& o) {
    // Status is written here (conditions) and by the usage sync (usage,
    // alerts): neither changes what the policy decides.
    const bool spec_same = old.value("spec", json()) == o.value("spec", json());
    const bool deleting_same = old.value("metadata", json::object()).contains("deletionTimestamp") ==
                               o.value("metadata", json::object()).contains("deletionTimestamp");
    if (!(spec_same && deleting_same)) changed(o);
  };
  handlers.on_delete = changed;
  InformerOptions options = informer;
  options.label_selector.clear();
  owned_informer_ = std::make_unique<Informer>(client_, resources::kQuotaPolicy, watch_namespace, options, handlers);
  informer_ = owned_informer_.get();
  // The reconciler judges from the caches (it is called again on every
  // change); the webhook reads live, so it sees a write made just before.
  webhook_admission_ = std::make_unique<QuotaAdmission>(
      informer_->cache(), moedeployments_, [this](const std::string& ns) -> Result<NamespaceObjects> {
        NamespaceObjects out;
        MOE_ASSIGN_OR_RETURN(json policies, client_.List(resources::kQuotaPolicy, ns));
        MOE_ASSIGN_OR_RETURN(json deployments, client_.List(resources::kMoEDeployment, ns));
        for (auto* list : {&policies, &deployments})
          if (!(*list).value("items", json()).is_array()) return Fail(Error::Unavailable("a list without items"));
        // managedFields are most of each object and nothing here reads them.
        for (auto* list : {&policies, &deployments})
          for (auto& item : (*list)["items"])
            if (item.is_object() && item.contains("metadata") && item["metadata"].is_object())
              item["metadata"].erase("managedFields");
        for (auto& p : policies["items"]) out.policies.push_back(std::move(p));
        for (auto& d : deployments["items"]) out.deployments.push_back(std::move(d));
        return out;
      }, std::move(scheduling), webhook_options_.reserved_vault_prefix, webhook_options_.reserved_vault_role);
  admission_ = std::make_unique<QuotaAdmission>(informer_->cache(), moedeployments_);
  reconciler_ = std::make_unique<QuotaPolicyReconciler>(client_, informer_->mutable_cache(), moedeployments_, *admission_);
}

QuotaController::~QuotaController() { Stop(); }

MoEDeploymentSpec::Budgeting QuotaController::BudgetingOf(const json& md) const {
  MoEDeploymentSpec::Budgeting b;
  const std::string ns = NamespaceOf(md);
  const std::vector<json> policies = informer_->cache().List(ns);
  const std::string name = GoverningPolicy(md, policies);
  for (const auto& p : policies) {
    if (!p.is_object() || !p.contains("metadata") || p["metadata"].value("name", json()) != json(name)) continue;
    const json spec = p.value("spec", json::object());
    b.policy = name;
    if (spec.is_object()) {
      b.pricing = spec.value("pricing", json());
      b.budgets = spec.value("budgets", json());
    }
  }
  return b;
}

QuotaCheck QuotaController::Check() const {
  const QuotaAdmission* admission = admission_.get();
  return [admission](const json& md, const MoEDeploymentSpec& spec) { return admission->Check(md, spec); };
}

Result<ReconcileResult> QuotaController::Reconcile(const std::string& key) {
  return reconciler_->Reconcile(key.substr(std::string(kQuotaPolicyKeyPrefix).size()));
}

void QuotaController::OnMoEDeployment(const json& md) {
  const std::string ns = NamespaceOf(md);
  const std::vector<json> policies = informer_->cache().List(ns);
  const std::string policy = GoverningPolicy(md, policies);
  if (policy.empty()) return;  // ungoverned: it weighs on nothing
  enqueue_(kQuotaPolicyKeyPrefix + ns + "/" + policy);
  for (const auto& other : moedeployments_.List(ns))
    if (GoverningPolicy(other, policies) == policy) enqueue_(ObjectKey(other));
}

Status QuotaController::StartWebhook() {
  if (webhook_options_.addr.empty() || webhook_options_.addr == "0") return Ok();
  const QuotaAdmission* admission = webhook_admission_.get();
  webhook_ = std::make_unique<WebhookController>(
      client_, webhook_options_, [admission](const std::string& path, std::string_view body) -> AdmissionHttpAnswer {
        if (path.substr(0, path.find('?')) != kWebhookPath)
          return {404, json({{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"}, {"code", 404},
                             {"message", "no webhook at " + path.substr(0, 256) + "; the quota webhook is at " +
                                             kWebhookPath}})
                           .dump(-1, ' ', false, json::error_handler_t::replace)};
        return admission->Review(body);
      });
  return webhook_->Start();
}

void QuotaController::SetLeading(bool leading) {
  if (webhook_) webhook_->SetLeading(leading);
}

void QuotaController::Stop() {
  if (webhook_) webhook_->Stop();
}

}  // namespace moeserve::op

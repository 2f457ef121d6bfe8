// A Kubernetes API client on cpprestsdk's HTTP client, JSON via nlohmann.
//
// Connection: a kubeconfig (current context: server, bearer token or token
// file, client certificate and key, CA data or file, insecure-skip-tls-verify)
// or in-cluster (service-account token, CA, KUBERNETES_SERVICE_HOST/PORT). A
// token file is re-read whenever its modification time changes, because the
// kubelet rotates projected service-account tokens in place.
//
// Errors: HTTP failures become Errors whose code says what a caller does next:
// 404 kNotFound, 409 kConflict (stale resourceVersion or AlreadyExists: requeue),
// 410 kUnavailable with message starting "410" (relist), 422/400 kInvalidArgument,
// 401/403 kPermissionDenied, 429/5xx/transport kUnavailable, a passed
// deadline kTimeout. The message is the apiserver's Status message.
//
// Deadlines: every request except a watch ends within the request timeout
// (response body included), or within the time a WriteFence has left for a
// write, whichever is sooner; past it the request is cancelled and fails.
//
// Thread safety: a KubeClient may be used from many threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::op {

using nlohmann::json;

struct KubeConfig {
  std::string server;  // https://host:port or http://127.0.0.1:port
  std::string token;
  std::string token_file;  // re-read on change; wins over token
  std::string ca_file, ca_data;
  std::string client_cert_file, client_cert_data, client_key_file, client_key_data;
  bool insecure_skip_tls_verify = false;
  std::string namespace_name = "default";  // the context's namespace
  std::string user_agent = "moe-operator";
  double request_timeout_s = 30;
};

// Reads `path`, or $KUBECONFIG when path is empty, using its current context.
Result<KubeConfig> LoadKubeconfig(const std::string& path);
// From the pod's environment; `secrets_dir` is where the service account is mounted.
Result<KubeConfig> InClusterConfig(const std::string& secrets_dir = "/var/run/secrets/kubernetes.io/serviceaccount");
// --kubeconfig flag, then $KUBECONFIG, then in-cluster, then ~/.kube/config.
Result<KubeConfig> ResolveKubeConfig(const std::string& kubeconfig_flag);

// Which API resource: the path pieces of /apis/<group>/<version>/<plural>.
struct ResourceRef {
  std::string group;  // "" for the core group
  std::string version;
  std::string plural;
  std::string kind;
  bool namespaced = true;
  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  // The collection path (ns "" = all namespaces), with name and subresource when given.
  std::string Path(const std::string& ns, const std::string& name = "", const std::string& subresource = "") const;
};

namespace resources {
extern const ResourceRef kMoEDeployment, kQuotaPolicy, kConfigMap, kSecret, kService, kStatefulSet,
    kPodDisruptionBudget, kPod, kEvent, kLease, kNamespace, kPersistentVolume, kPersistentVolumeClaim,
    kServiceAccount, kNetworkPolicy;
}  // namespace resources

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;          // page size; 0 = everything at once
  std::string continue_token;  // from the previous page's metadata.continue
};

struct WatchOptions {
  std::string resource_version;
  std::string label_selector;
  int timeout_seconds = 300;  // the server ends the watch after this
  bool allow_bookmarks = true;
};

// How a watch stream ended.
enum class WatchEnd {
  kClosed,     // the server ended it (timeout, or the double's fault injection); re-watch from the last rv
  kGone,       // 410: the resourceVersion is too old; relist
  kCancelled,  // Cancel() was called
};

// Preconditions of a DELETE: the server refuses it (409) unless the object
// still has this uid / resourceVersion, so a decision made on a cached copy
// never removes an object that was replaced or changed since.
struct Preconditions {
  std::string uid;
  std::string resource_version;
};

// Writes allowed until a deadline on the steady clock. Leader election moves
// the deadline forward on each renewal and closes it on stepping down; a
// client with a fence sends no write once it has passed and cuts off writes
// in flight when it passes, so a deposed leader stops writing at once.
//
// Thread safety: any thread.
class WriteFence {
 public:
  using Clock = std::chrono::steady_clock;
  void ExtendTo(Clock::time_point until) { until_ns_ = until.time_since_epoch().count(); }
  void Close() { until_ns_ = 0; }
  // Time left; zero or less once closed or passed.
  std::chrono::milliseconds Remaining() const {
    const int64_t until = until_ns_.load();
    if (until == 0) return std::chrono::milliseconds(0);
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point(Clock::duration(until)) -
                                                                  Clock::now());
  }

 private:
  std::atomic<int64_t> until_ns_{0};
};

class KubeClient {
 public:
  static Result<std::unique_ptr<KubeClient>> Create(const KubeConfig& config);
  ~KubeClient();

  // `timeout` (> 0) shortens the request timeout for this one call.
  Result<json> Get(const ResourceRef& r, const std::string& ns, const std::string& name,
                   std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  Result<json> List(const ResourceRef& r, const std::string& ns, const ListOptions& options = {});
  // Every page of a list (options.limit per page, 500 when unset), joined.
  // The resourceVersion is the first page's, so a watch from it replays
  // whatever changed while later pages were read.
  Result<json> ListAll(const ResourceRef& r, const std::string& ns, ListOptions options = {});
  Result<json> Create(const ResourceRef& r, const std::string& ns, const json& object);
  // PUT, with metadata.resourceVersion.
  Result<json> Update(const ResourceRef& r, const json& object,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  Result<json> UpdateStatus(const ResourceRef& r, const json& object);  // PUT .../status
  // POST to a subresource of one object (serviceaccounts/<name>/token: a TokenRequest).
  Result<json> CreateSubresource(const ResourceRef& r, const std::string& ns, const std::string& name,
                                 const std::string& subresource, const json& body);
  // patch_type: "application/merge-patch+json", "application/strategic-merge-patch+json",
  // "application/json-patch+json" or "application/apply-patch+yaml" (with field_manager).
  Result<json> Patch(const ResourceRef& r, const std::string& ns, const std::string& name,
                     const std::string& patch_type, const json& patch, const std::string& subresource = "",
                     const std::string& field_manager = "", bool force = false);
  Status Delete(const ResourceRef& r, const std::string& ns, const std::string& name,
                const std::string& propagation = "Background", const Preconditions& preconditions = {});

  // Streams a watch, calling on_event(type, object) for each event (ADDED,
  // MODIFIED, DELETED, BOOKMARK). Returns how it ended, or an error when it
  // could not start or broke mid-stream (reconnect with backoff).
  Result<WatchEnd> Watch(const ResourceRef& r, const std::string& ns, const WatchOptions& options,
                         const std::function<void(const std::string& type, const json& object)>& on_event);
  // Ends every watch in progress and makes new ones return kCancelled.
  void CancelWatches();

  const KubeConfig& config() const { return config_; }

  // Lowers the request timeout (never raises it): leader election keeps
  // every call below its renew deadline.
  void LimitRequestTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds RequestTimeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }
  // From now on writes (POST, PUT, PATCH, DELETE) obey `fence`, except those
  // whose path starts with `exempt_prefix` (the elector's own Lease).
  void SetWriteFence(std::shared_ptr<WriteFence> fence, std::string exempt_prefix);

 private:
  struct Impl;
  explicit KubeClient(KubeConfig config);
  Result<json> Call(const std::string& method, const std::string& path_and_query, const std::string& content_type,
                    const std::string& body, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  std::string BearerToken();

  KubeConfig config_;
  std::atomic<int64_t> timeout_ms_{30000};
  std::mutex fence_mu_;
  std::shared_ptr<WriteFence> fence_;
  std::string fence_exempt_prefix_;
  std::unique_ptr<Impl> impl_;
  std::mutex token_mu_;
  std::string token_;
  int64_t token_mtime_ns_ = -1;
};

// Query-string escaping for selectors and names.
std::string UrlEncode(const std::string& s);

}  // namespace moeserve::op

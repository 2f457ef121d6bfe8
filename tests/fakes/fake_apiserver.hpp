// FakeApiServer: a Kubernetes API server double that speaks the real protocol
// over HTTP on 127.0.0.1, for the operator's tests, its bench and kubectl.
//
// What it does as kube-apiserver does: discovery (/version, /api, /apis, group
// versions, /openapi/v3 with the PATCH fieldValidation parameter so kubectl
// validates server-side); create/get/list/update/delete; JSON merge patch,
// JSON patch, strategic merge patch (built-in kinds), server-side apply with
// field managers and conflicts; resourceVersion (one global counter) and
// generation; label and field selectors; watches streamed as chunked JSON
// with bookmarks and replay from a resourceVersion; 409 Conflict on a stale
// resourceVersion; 410 Gone for a resourceVersion older than the kept
// history; status and scale subresources; deletionTimestamp with finalizers;
// background garbage collection through ownerReferences; Table responses
// from CRD printer columns (and kube-apiserver's columns for pods,
// StatefulSets, Services and Endpoints); CRDs registered by POSTing them (or from files)
// with defaulting, pruning and validation against their OpenAPI schema.
//
// What it does not: authentication/authorisation (any bearer token passes;
// the last one seen is recorded), mutating admission webhooks (validating
// ones are called: admission.hpp), protobuf beyond the built-in kinds
// kubectl's create commands send (protobuf_objects.hpp), HTTP/2, TLS,
// pagination (limit is ignored; every list is complete), and controllers (a
// test plays the kubelet and StatefulSet controller through Mutate(), or
// starts a PodRunner: pod_runner.hpp).
//
// Faults for tests: every nth write answered 409, watches dropped after n
// events (alternately ended cleanly and cut), every nth watch answered 410,
// requests for one resource held back (a slow server).
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission.hpp"
#include "http_server.hpp"
#include "token_api.hpp"
#include "moeserve/common/status.hpp"

namespace moeserve::fakes {

struct FakeApiServerOptions {
  size_t watch_history = 100000;     // events kept for watch replay; older resourceVersions get 410
  double bookmark_interval_s = 1.0;  // when the client asked for bookmarks
};

struct FakeFaults {
  int conflict_every_nth_write = 0;  // 0: never; counts writes except Leases and Events
  int drop_watch_after_events = 0;   // 0: never
  int gone_every_nth_watch = 0;      // 0: never; only watches that name a resourceVersion
  // A slow server: requests for this resource (plural, e.g. "leases") wait
  // stall_ms before they are handled. Empty: none.
  std::string stall_resource;
  int stall_ms = 0;
};

struct WriteRecord {
  std::string method;
  std::string path;
  std::string user_agent;
  int status = 0;
  std::string body;                                // the request body (DeleteOptions for a DELETE)
  std::chrono::steady_clock::time_point handled;  // when the server acted on it
};

// One resource request as RBAC sees it (kube-apiserver's RequestInfo): the
// verb (get, list, watch, create, update, patch, delete, deletecollection),
// API group, resource, subresource and namespace, parsed from the path whether
// or not the double serves that resource. Recorded when the request is acted
// on (after any stall; a watch when it starts).
struct RequestRecord {
  std::string verb, group, version, resource, subresource, ns, name, user_agent;
  int status = 0;  // 0 for a watch
};

struct ResourceType {
  std::string group, version, plural, singular, kind, list_kind;
  bool namespaced = true;
  bool has_status = false;
  bool has_scale = false;
  std::string scale_spec_path = ".spec.replicas", scale_status_path = ".status.replicas";
  std::vector<std::string> short_names, categories;
  nlohmann::json schema;           // openAPIV3Schema (custom resources only)
  nlohmann::json printer_columns;  // additionalPrinterColumns
  bool custom = false;
  std::string GroupVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string Qualified() const { return group.empty() ? plural : plural + "." + group; }
};

class FakeApiServer {
 public:
  explicit FakeApiServer(FakeApiServerOptions options = {});
  ~FakeApiServer();

  int Start(int port = 0);  // returns the port, or -1
  void Stop();
  std::string url() const;

  // Registers a CRD (as if POSTed), e.g. each document of crds/*.yaml.
  Status RegisterCrd(const nlohmann::json& crd);
  Status RegisterCrdFile(const std::string& path);
  // Writes a kubeconfig whose current context points at this server.
  Status WriteKubeconfig(const std::string& path, const std::string& namespace_name = "default") const;

  // Direct access for tests, through the same code paths as HTTP requests.
  // resource is "configmaps", "statefulsets.apps", "moedeployments.moeserve.io".
  Result<nlohmann::json> Get(const std::string& resource, const std::string& ns, const std::string& name);
  std::vector<nlohmann::json> List(const std::string& resource, const std::string& ns = "");
  // How many objects match, without copying them.
  size_t Count(const std::string& resource, const std::string& ns, const std::function<bool(const nlohmann::json&)>& pred);
  Result<nlohmann::json> Create(const std::string& resource, const nlohmann::json& object);
  // Reads, mutates and writes back (retrying internal conflicts); status=true
  // writes through the status subresource.
  Result<nlohmann::json> Mutate(const std::string& resource, const std::string& ns, const std::string& name,
                                const std::function<void(nlohmann::json&)>& mutate, bool status = false);
  Status Delete(const std::string& resource, const std::string& ns, const std::string& name);

  // What GET pods/<name>/log answers (kubectl logs): the pod runner's
  // container logs. Unset: 404.
  using PodLogReader = std::function<Result<std::string>(const std::string& ns, const std::string& pod,
                                                         const std::string& container, bool previous)>;
  void SetPodLogReader(PodLogReader reader);

  void SetFaults(const FakeFaults& faults);
  // Forgets watch history so that every resourceVersion given so far is 410 Gone.
  void CompactHistory();
  std::vector<WriteRecord> Writes() const;
  // Every resource request over HTTP (discovery and OpenAPI excluded).
  std::vector<RequestRecord> Requests() const;
  int64_t CurrentResourceVersion() const;
  size_t ActiveWatches() const;
  size_t WatchRequests() const { return watch_requests_.load(); }
  std::string LastBearerToken() const;
  // TokenRequest (serviceaccounts/<name>/token) and TokenReview (tokenreviews).
  TokenApi& tokens() { return token_api_; }
  // Validating webhooks (admission.hpp): ValidatingWebhookConfigurations
  // stored here are called on HTTP writes (create, update, patch, scale) of
  // objects they match; the direct-access methods above are not admitted.
  WebhookAdmission& admission() { return admission_; }

  struct Outcome {
    int code = 200;
    nlohmann::json body;
  };

 private:
  struct Watcher;
  struct Request;

  void Handle(const HttpRequest& request, HttpResponseWriter& writer);
  void HandleWatch(const Request& r, HttpResponseWriter& writer);
  Outcome Discovery(const HttpRequest& request, bool* handled);
  Outcome OpenApi(const HttpRequest& request, bool* handled);
  Outcome Dispatch(const Request& r);
  // Runs the write as a dry run, then the matching webhooks without mu_
  // held: a refusal, or nothing (go on) with the judged object's
  // resourceVersion in *judged_rv ("" when it did not exist).
  std::optional<Outcome> RunAdmission(const Request& r, std::string* judged_rv);

  Outcome DoGet(const Request& r);
  Outcome DoList(const Request& r);
  Outcome DoCreate(const Request& r, nlohmann::json object);
  Outcome DoUpdate(const Request& r, nlohmann::json object, bool from_patch);
  Outcome DoPatch(const Request& r);
  Outcome DoDelete(const Request& r);
  Outcome DoScale(const Request& r);

  // Under mu_:
  const ResourceType* FindType(const std::string& group_version, const std::string& plural) const;
  const ResourceType* FindTypeByQualified(const std::string& qualified) const;
  Outcome Admit(const ResourceType& type, nlohmann::json& object, bool strict);
  void Commit(const ResourceType& type, const std::string& event_type, nlohmann::json& object);
  void RemoveLocked(const ResourceType& type, const std::string& key, nlohmann::json object);
  void CollectGarbageLocked(const std::string& owner_uid);
  void RegisterCrdLocked(const nlohmann::json& crd);
  bool InjectConflict(const ResourceType& type);
  void RecordManagedFields(nlohmann::json& object, const nlohmann::json& before, const std::string& manager,
                           const std::string& operation, const std::string& api_version);
  nlohmann::json ToTable(const ResourceType& type, const std::vector<nlohmann::json>& objects,
                         const std::string& list_rv, bool include_object);

  FakeApiServerOptions options_;
  HttpServer http_;
  mutable std::mutex mu_;
  std::vector<ResourceType> types_;
  // qualified resource -> "ns/name" -> object
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;
  struct Event {
    int64_t rv;
    std::string resource;
    std::string type;
    nlohmann::json object;
  };
  std::deque<Event> history_;
  int64_t compacted_rv_ = 0;
  int64_t rv_ = 100;
  uint64_t uid_counter_ = 0;
  std::vector<std::shared_ptr<Watcher>> watchers_;
  FakeFaults faults_;
  int64_t write_count_ = 0;
  int64_t watch_count_ = 0;
  std::vector<WriteRecord> writes_;
  std::vector<RequestRecord> requests_;
  std::string last_token_;
  PodLogReader log_reader_;
  TokenApi token_api_;  // locked after mu_ when both are held
  WebhookAdmission admission_;  // never called with mu_ held
  std::atomic<size_t> watch_requests_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace moeserve::fakes

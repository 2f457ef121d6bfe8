// Informers: a list, then a watch from the list's resourceVersion (with
// bookmarks), keeping a cache of one resource that handlers are told about.
//
//  - A watch that ends is resumed from the last resourceVersion seen (an
//    event's or a bookmark's); one that breaks is resumed after a backoff
//    that doubles up to a cap and resets once a watch delivers something.
//  - 410 Gone (as an HTTP status or an ERROR event) means the server no
//    longer has history from that resourceVersion: relist and tell the
//    handlers what changed in between, deletions included, so nothing is missed.
//
// Thread safety: the cache may be read from any thread; handlers run on the
// informer's own thread, one at a time, after the cache was updated.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moeserve/operator/kube_client.hpp"

namespace moeserve::op {

// "namespace/name" (or "name" for cluster-scoped objects).
std::string ObjectKey(const json& object);

// The shared cache: the latest object per key, as the informer saw it.
class ObjectCache {
 public:
  std::optional<json> Get(const std::string& key) const;
  // Objects in `ns` ("" = all) whose labels include every label in `labels`.
  std::vector<json> List(const std::string& ns = "", const std::map<std::string, std::string>& labels = {}) const;
  size_t Size() const;

  void Upsert(const json& object);
  // Write-through after our own write: stores `object` only if the cached
  // copy still has `expected_rv` ("" = still absent). If the informer has
  // moved on (our own write's event, or a newer change), its copy stays:
  // replacing it could put an older object back and hide the newer change.
  bool UpsertIfUnchanged(const json& object, const std::string& expected_rv);
  void Remove(const std::string& key);
  // Replaces everything; returns the objects that disappeared.
  std::vector<json> Replace(std::map<std::string, json> objects);

 private:
  mutable std::mutex mu_;
  std::map<std::string, json> objects_;
};

struct InformerHandlers {
  std::function<void(const json& object)> on_add;
  std::function<void(const json& old_object, const json& new_object)> on_update;
  std::function<void(const json& object)> on_delete;
};

struct InformerOptions {
  std::string label_selector;
  int watch_timeout_s = 300;
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{30000};
  // managedFields are often the largest part of an object and nothing here
  // reads them (controller-runtime's TransformStripManagedFields).
  bool strip_managed_fields = true;
  int64_t list_page_size = 500;  // client-go's page size
  // Namespaced objects outside these namespaces are left out of the cache
  // and the handlers (moe-operator --watch-namespace, given more than once:
  // the operator lists across the cluster but acts only there). Empty: all.
  std::vector<std::string> namespaces;
};

class Informer {
 public:
  Informer(KubeClient& client, ResourceRef resource, std::string ns, InformerOptions options,
           InformerHandlers handlers);
  ~Informer();

  void Start();
  void Stop();  // the client's watches must be cancelled too (KubeClient::CancelWatches)
  bool HasSynced() const { return synced_; }
  // Waits until the first list was applied, or the timeout passed.
  bool WaitForSync(std::chrono::milliseconds timeout) const;
  const ObjectCache& cache() const { return cache_; }
  // For a reconciler that writes its own writes through (the informer's
  // next event for the object replaces them).
  ObjectCache& mutable_cache() { return cache_; }
  const ResourceRef& resource() const { return resource_; }

  size_t relists() const { return relists_; }
  size_t watch_restarts() const { return watch_restarts_; }
  std::string last_resource_version() const;

 private:
  void Run();
  Status ListAndReplace();
  bool Wanted(const json& object) const;  // within options_.namespaces
  void SleepFor(std::chrono::milliseconds d);

  KubeClient& client_;
  ResourceRef resource_;
  std::string ns_;
  InformerOptions options_;
  InformerHandlers handlers_;
  ObjectCache cache_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> synced_{false};
  std::atomic<size_t> relists_{0}, watch_restarts_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::string rv_;
};

}  // namespace moeserve::op

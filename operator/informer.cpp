#include "moeserve/operator/informer.hpp"

#include <algorithm>

#include "moeserve/common/log.hpp"

namespace moeserve::op {

Informer::Informer(KubeClient& client, ResourceRef resource, std::string ns, InformerOptions options,
                   InformerHandlers handlers)
    : client_(client),
      resource_(std::move(resource)),
      ns_(std::move(ns)),
      options_(std::move(options)),
      handlers_(std::move(handlers)) {}

Informer::~Informer() { Stop(); }

void Informer::Start() { thread_ = std::thread([this] { Run(); }); }

void Informer::Stop() {
  stopping_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return synced_.load() || stopping_.load(); }) && synced_;
}

std::string Informer::last_resource_version() const {
  std::lock_guard lock(mu_);
  return rv_;
}

void Informer::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_.load(); });
}

namespace {

// Handlers run on the informer's thread: an exception there would end the
// process, so it is logged and the informer goes on.
template <typename F>
void Notify(const std::string& what, F&& handler) {
  try {
    handler();
  } catch (const std::exception& e) {
    log::Warn("informer " + what + ": handler failed: " + e.what());
  } catch (...) {
    log::Warn("informer " + what + ": handler failed");
  }
}

}  // namespace

bool Informer::Wanted(const json& object) const {
  if (options_.namespaces.empty() || !resource_.namespaced) return true;
  const json meta = object.value("metadata", json::object());
  const json ns = meta.is_object() ? meta.value("namespace", json()) : json();
  return ns.is_string() &&
         std::find(options_.namespaces.begin(), options_.namespaces.end(), ns.get<std::string>()) != options_.namespaces.end();
}

Status Informer::ListAndReplace() {
  ListOptions list_options;
  list_options.label_selector = options_.label_selector;
  list_options.limit = options_.list_page_size;
  MOE_ASSIGN_OR_RETURN(json list, client_.ListAll(resource_, ns_, list_options));
  std::map<std::string, json> fresh;
  for (auto& item : list["items"]) {
    if (!Wanted(item)) continue;
    // Lists carry kind/apiVersion on the list, not on items; handlers want them.
    item["kind"] = resource_.kind;
    item["apiVersion"] = resource_.ApiVersion();
    if (options_.strip_managed_fields) item["metadata"].erase("managedFields");
    fresh[ObjectKey(item)] = item;
  }
  std::vector<std::pair<std::optional<json>, json>> changes;
  for (const auto& [key, object] : fresh) {
    auto old = cache_.Get(key);
    if (!old || (*old)["metadata"].value("resourceVersion", "") != object["metadata"].value("resourceVersion", ""))
      changes.push_back({old, object});
  }
  std::vector<json> gone = cache_.Replace(std::move(fresh));
  {
    std::lock_guard lock(mu_);
    rv_ = list["metadata"].value("resourceVersion", "");
    synced_ = true;
  }
  cv_.notify_all();
  relists_++;
  for (const auto& [old, object] : changes) {
    if (old) {
      if (handlers_.on_update) Notify(resource_.plural, [&] { handlers_.on_update(*old, object); });
    } else if (handlers_.on_add) {
      Notify(resource_.plural, [&] { handlers_.on_add(object); });
    }
  }
  for (const auto& object : gone)
    if (handlers_.on_delete) Notify(resource_.plural, [&] { handlers_.on_delete(object); });
  return Ok();
}

void Informer::Run() {
  bool need_list = true;
  auto backoff = options_.backoff_initial;
  while (!stopping_) {
    if (need_list) {
      auto listed = ListAndReplace();
      if (!listed) {
        log::Warn("informer " + resource_.plural + ": list failed: " + listed.error().ToString());
        SleepFor(backoff);
        backoff = std::min(backoff * 2, options_.backoff_max);
        continue;
      }
      need_list = false;
    }
    WatchOptions watch_options;
    watch_options.resource_version = last_resource_version();
    watch_options.label_selector = options_.label_selector;
    watch_options.timeout_seconds = options_.watch_timeout_s;
    size_t delivered = 0;
    auto ended = client_.Watch(resource_, ns_, watch_options, [&](const std::string& type, const json& in) {
      json object = in;
      if (options_.strip_managed_fields && object.contains("metadata")) object["metadata"].erase("managedFields");
      std::string rv = object["metadata"].value("resourceVersion", "");
      if (type == "BOOKMARK") {
        std::lock_guard lock(mu_);
        rv_ = rv;
        return;
      }
      delivered++;
      if (!Wanted(object)) {
        std::lock_guard lock(mu_);
        rv_ = rv;
        return;
      }
      const std::string key = ObjectKey(object);
      auto old = cache_.Get(key);
      if (type == "DELETED") {
        cache_.Remove(key);
      } else {
        cache_.Upsert(object);
      }
      {
        std::lock_guard lock(mu_);
        rv_ = rv;
      }
      if (type == "DELETED") {
        if (handlers_.on_delete) Notify(resource_.plural, [&] { handlers_.on_delete(object); });
      } else if (old) {
        if (handlers_.on_update) Notify(resource_.plural, [&] { handlers_.on_update(*old, object); });
      } else if (handlers_.on_add) {
        Notify(resource_.plural, [&] { handlers_.on_add(object); });
      }
    });
    if (stopping_) break;
    watch_restarts_++;
    if (!ended) {
      log::Debug("informer " + resource_.plural + ": watch broke: " + ended.error().ToString());
      SleepFor(backoff);
      backoff = std::min(backoff * 2, options_.backoff_max);
      continue;
    }
    switch (*ended) {
      case WatchEnd::kCancelled:
        return;
      case WatchEnd::kGone:
        log::Debug("informer " + resource_.plural + ": 410 Gone, relisting");
        need_list = true;
        break;
      case WatchEnd::kClosed:
        if (delivered > 0) backoff = options_.backoff_initial;
        break;
    }
  }
}

}  // namespace moeserve::op

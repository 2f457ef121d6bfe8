// ObjectKey and ObjectCache (declared in informer.hpp), apart from the
// informer so that code judging cached objects (the quota decision and its
// fuzz target) links without the Kubernetes client.
#include "moeserve/operator/informer.hpp"

namespace moeserve::op {

std::string ObjectKey(const json& object) {
  const json& m = object["metadata"];
  std::string ns = m.value("namespace", "");
  return ns.empty() ? m.value("name", "") : ns + "/" + m.value("name", "");
}

std::optional<json> ObjectCache::Get(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

std::vector<json> ObjectCache::List(const std::string& ns, const std::map<std::string, std::string>& labels) const {
  std::lock_guard lock(mu_);
  std::vector<json> out;
  for (const auto& [key, object] : objects_) {
    const json& m = object["metadata"];
    if (!ns.empty() && m.value("namespace", "") != ns) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      const json& l = m.contains("labels") ? m["labels"] : json::object();
      if (!l.contains(k) || l[k] != v) {
        match = false;
        break;
      }
    }
    if (match) out.push_back(object);
  }
  return out;
}

size_t ObjectCache::Size() const {
  std::lock_guard lock(mu_);
  return objects_.size();
}

void ObjectCache::Upsert(const json& object) {
  std::lock_guard lock(mu_);
  objects_[ObjectKey(object)] = object;
}

bool ObjectCache::UpsertIfUnchanged(const json& object, const std::string& expected_rv) {
  std::lock_guard lock(mu_);
  const std::string key = ObjectKey(object);
  auto it = objects_.find(key);
  const std::string current = it == objects_.end() ? "" : it->second["metadata"].value("resourceVersion", "");
  if (it == objects_.end() ? !expected_rv.empty() : current != expected_rv) return false;
  objects_[key] = object;
  return true;
}

void ObjectCache::Remove(const std::string& key) {
  std::lock_guard lock(mu_);
  objects_.erase(key);
}

std::vector<json> ObjectCache::Replace(std::map<std::string, json> objects) {
  std::lock_guard lock(mu_);
  std::vector<json> gone;
  for (const auto& [key, object] : objects_)
    if (!objects.count(key)) gone.push_back(object);
  objects_ = std::move(objects);
  return gone;
}

}  // namespace moeserve::op

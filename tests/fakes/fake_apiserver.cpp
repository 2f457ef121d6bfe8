#include "fake_apiserver.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/rfc3339.hpp"
#include "openapi_schema.hpp"
#include "patches.hpp"
#include "protobuf_objects.hpp"
#include "yaml_json.hpp"

namespace moeserve::fakes {

using nlohmann::json;
using Outcome = FakeApiServer::Outcome;

struct FakeApiServer::Watcher {
  std::string resource;
  std::string ns;
  std::string label_selector;
  std::string field_selector;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<json> events;
  bool closed = false;
};

struct FakeApiServer::Request {
  std::string method;
  const ResourceType* type = nullptr;
  std::string ns, name, subresource;
  std::map<std::string, std::string> query;
  std::string body, content_type, accept, user_agent;
  bool admission_pass = false;  // the dry run that admission judges: no injected faults
  std::string Query(const std::string& k) const {
    auto it = query.find(k);
    return it == query.end() ? "" : it->second;
  }
};

namespace {

int64_t ParseRfc3339(const std::string& s) {
  std::tm tm{};
  if (!strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

// kubectl's HumanDuration, as the apiserver renders `date` printer columns.
std::string HumanDuration(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  auto s = [](int64_t v) { return std::to_string(v); };
  if (seconds < 120) return s(seconds) + "s";
  int64_t minutes = seconds / 60;
  if (minutes < 10) return seconds % 60 == 0 ? s(minutes) + "m" : s(minutes) + "m" + s(seconds % 60) + "s";
  if (minutes < 180) return s(minutes) + "m";
  int64_t hours = minutes / 60;
  if (hours < 8) return minutes % 60 == 0 ? s(hours) + "h" : s(hours) + "h" + s(minutes % 60) + "m";
  if (hours < 48) return s(hours) + "h";
  if (hours < 192) return hours % 24 == 0 ? s(hours / 24) + "d" : s(hours / 24) + "d" + s(hours % 24) + "h";
  if (hours < 24 * 365 * 2) return s(hours / 24) + "d";
  return s(hours / 24 / 365) + "y";
}


// kube-apiserver's table columns for the built-in kinds a person watches
// while pods run (its printers in pkg/printers/internalversion); a column
// with "compute" is worked out by BuiltinCell, the rest by jsonPath.
json BuiltinPrinterColumns(const ResourceType& type) {
  const json age = {{"name", "Age"}, {"type", "date"}, {"jsonPath", ".metadata.creationTimestamp"}};
  auto computed = [](const char* name, const char* what, int priority = 0) {
    return json{{"name", name}, {"type", "string"}, {"compute", what}, {"priority", priority}};
  };
  if (type.group.empty() && type.plural == "pods")
    return json::array({computed("Ready", "pod-ready"), computed("Status", "pod-status"),
                        computed("Restarts", "pod-restarts"), age,
                        {{"name", "IP"}, {"type", "string"}, {"jsonPath", ".status.podIP"}, {"priority", 1}},
                        {{"name", "Node"}, {"type", "string"}, {"jsonPath", ".spec.nodeName"}, {"priority", 1}}});
  if (type.group == "apps" && type.plural == "statefulsets")
    return json::array({computed("Ready", "sts-ready"), age});
  if (type.group.empty() && type.plural == "services")
    return json::array({{{"name", "Type"}, {"type", "string"}, {"jsonPath", ".spec.type"}},
                        {{"name", "Cluster-IP"}, {"type", "string"}, {"jsonPath", ".spec.clusterIP"}},
                        computed("Port(s)", "svc-ports"), age});
  if (type.group.empty() && type.plural == "endpoints") return json::array({computed("Endpoints", "ep-addresses"), age});
  return json::array({age});
}

// kubectl's pod STATUS: the first init container not done, else the last
// main container's waiting or terminated reason, else the phase.
std::string PodStatusText(const json& pod) {
  const json status = pod.value("status", json::object());
  std::string reason = status.value("reason", status.value("phase", "Pending"));
  const json inits = status.value("initContainerStatuses", json::array());
  const size_t init_total = pod["spec"].value("initContainers", json::array()).size();
  bool initializing = false;
  for (size_t i = 0; i < inits.size(); ++i) {
    const json state = inits[i].value("state", json::object());
    if (state.contains("terminated") && state["terminated"].value("exitCode", 0) == 0) continue;
    initializing = true;
    if (state.contains("terminated")) {
      const std::string r = state["terminated"].value("reason", "");
      reason = "Init:" + (r.empty() ? "ExitCode:" + std::to_string(state["terminated"].value("exitCode", 0)) : r);
    } else if (state.contains("waiting") && state["waiting"].value("reason", "") != "PodInitializing") {
      reason = "Init:" + state["waiting"].value("reason", "");
    } else {
      reason = "Init:" + std::to_string(i) + "/" + std::to_string(init_total);
    }
    break;
  }
  if (!initializing) {
    for (const auto& c : status.value("containerStatuses", json::array())) {
      const json state = c.value("state", json::object());
      if (state.contains("waiting") && !state["waiting"].value("reason", "").empty())
        reason = state["waiting"]["reason"];
      else if (state.contains("terminated"))
        reason = state["terminated"].value("reason", "Error");
    }
  }
  if (pod["metadata"].contains("deletionTimestamp")) reason = "Terminating";
  return reason;
}

json BuiltinCell(const ResourceType&, const std::string& what, const json& object) {
  const json status = object.value("status", json::object());
  if (what == "pod-ready") {
    const json cs = status.value("containerStatuses", json::array());
    int ready = 0;
    for (const auto& c : cs) ready += c.value("ready", false) ? 1 : 0;
    return std::to_string(ready) + "/" + std::to_string(object["spec"].value("containers", json::array()).size());
  }
  if (what == "pod-status") return PodStatusText(object);
  if (what == "pod-restarts") {
    int restarts = 0;
    for (const auto& c : status.value("containerStatuses", json::array())) restarts += c.value("restartCount", 0);
    return std::to_string(restarts);
  }
  if (what == "sts-ready")
    return std::to_string(status.value("readyReplicas", 0)) + "/" + std::to_string(object["spec"].value("replicas", 1));
  if (what == "svc-ports") {
    std::string out;
    for (const auto& p : object["spec"].value("ports", json::array()))
      out += (out.empty() ? "" : ",") + std::to_string(p.value("port", 0)) + "/" + p.value("protocol", "TCP");
    return out.empty() ? "<none>" : out;
  }
  if (what == "ep-addresses") {
    std::string out;
    for (const auto& subset : object.value("subsets", json::array()))
      for (const auto& a : subset.value("addresses", json::array()))
        for (const auto& p : subset.value("ports", json::array()))
          out += (out.empty() ? "" : ",") + a.value("ip", "") + ":" + std::to_string(p.value("port", 0));
    return out.empty() ? "<none>" : out;
  }
  return "";
}

json StatusBody(int code, const std::string& reason, const std::string& message, json details = nullptr) {
  json s = {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Failure"},
            {"message", message}, {"reason", reason},   {"code", code}};
  if (!details.is_null()) s["details"] = details;
  return s;
}

Outcome Failure(int code, const std::string& reason, const std::string& message, json details = nullptr) {
  return {code, StatusBody(code, reason, message, std::move(details))};
}

Outcome NotFound(const ResourceType& t, const std::string& name) {
  return Failure(404, "NotFound", t.Qualified() + " \"" + name + "\" not found",
                 {{"name", name}, {"group", t.group}, {"kind", t.plural}});
}

Outcome ConflictOutcome(const ResourceType& t, const std::string& name) {
  return Failure(409, "Conflict",
                 "Operation cannot be fulfilled on " + t.Qualified() + " \"" + name +
                     "\": the object has been modified; please apply your changes to the latest version and try again",
                 {{"name", name}, {"group", t.group}, {"kind", t.plural}});
}

std::string Trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

// Splits on commas that are not inside parentheses.
std::vector<std::string> SplitTerms(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '(') depth++;
    if (c == ')') depth--;
    if (c == ',' && depth == 0) {
      out.push_back(Trim(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!Trim(cur).empty()) out.push_back(Trim(cur));
  return out;
}

bool MatchesLabelSelector(const json& object, const std::string& selector) {
  if (selector.empty()) return true;
  json labels = object["metadata"].value("labels", json::object());
  auto label = [&](const std::string& k) -> std::optional<std::string> {
    if (!labels.contains(k) || !labels[k].is_string()) return std::nullopt;
    return labels[k].get<std::string>();
  };
  static const std::regex kSet(R"(^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$)");
  for (const auto& term : SplitTerms(selector)) {
    std::smatch m;
    const bool set_based = term.find(" in ") != std::string::npos || term.find(" notin ") != std::string::npos;
    if (set_based && std::regex_match(term, m, kSet)) {
      std::set<std::string> values;
      for (auto& v : SplitTerms(m[3].str())) values.insert(v);
      auto v = label(m[1].str());
      bool in = v && values.count(*v);
      if (m[2] == "in" ? !in : in) return false;
    } else if (auto p = term.find("!="); p != std::string::npos) {
      auto v = label(Trim(term.substr(0, p)));
      if (v && *v == Trim(term.substr(p + 2))) return false;
    } else if (auto q = term.find('='); q != std::string::npos) {
      std::string value = term.substr(term[q + 1] == '=' ? q + 2 : q + 1);
      auto v = label(Trim(term.substr(0, q)));
      if (!v || *v != Trim(value)) return false;
    } else if (!term.empty() && term[0] == '!') {
      if (label(Trim(term.substr(1)))) return false;
    } else if (!label(term)) {
      return false;
    }
  }
  return true;
}

std::string FieldValue(const json& object, const std::string& dotted) {
  const json* node = &object;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object() || !node->contains(part)) return "";
    node = &(*node)[part];
  }
  if (node->is_string()) return node->get<std::string>();
  if (node->is_null()) return "";
  return node->dump();
}

bool MatchesFieldSelector(const json& object, const std::string& selector) {
  for (const auto& term : SplitTerms(selector)) {
    bool negate = false;
    auto p = term.find("!=");
    std::string key, value;
    if (p != std::string::npos) {
      negate = true;
      key = term.substr(0, p);
      value = term.substr(p + 2);
    } else {
      auto q = term.find('=');
      if (q == std::string::npos) continue;
      key = term.substr(0, q);
      value = term.substr(term[q + 1] == '=' ? q + 2 : q + 1);
    }
    bool equal = FieldValue(object, Trim(key)) == Trim(value);
    if (equal == negate) return false;
  }
  return true;
}

// The printer-column subset of JSONPath: .a.b, .a[0].b, .a[*].b
json EvalJsonPath(const json& object, const std::string& path) {
  std::vector<json> current = {object};
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '.') {
      size_t j = i + 1;
      while (j < path.size() && path[j] != '.' && path[j] != '[') j++;
      std::string key = path.substr(i + 1, j - i - 1);
      std::vector<json> next;
      for (auto& c : current)
        if (c.is_object() && c.contains(key)) next.push_back(c[key]);
      current = next;
      i = j;
    } else if (path[i] == '[') {
      size_t j = path.find(']', i);
      if (j == std::string::npos) break;
      std::string index = path.substr(i + 1, j - i - 1);
      std::vector<json> next;
      for (auto& c : current) {
        if (!c.is_array()) continue;
        if (index == "*") {
          for (auto& e : c) next.push_back(e);
        } else {
          size_t k = std::stoul(index);
          if (k < c.size()) next.push_back(c[k]);
        }
      }
      current = next;
      i = j + 1;
    } else {
      break;
    }
  }
  if (current.empty()) return nullptr;
  if (current.size() == 1) return current[0];
  return current;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string ObjectKey(const json& object) {
  return object["metadata"].value("namespace", "") + "/" + object["metadata"].value("name", "");
}

ResourceType Builtin(std::string group, std::string plural, std::string singular, std::string kind, bool namespaced,
                     bool has_status, bool has_scale = false, std::vector<std::string> short_names = {}) {
  ResourceType t;
  t.group = std::move(group);
  t.version = "v1";
  t.plural = std::move(plural);
  t.singular = std::move(singular);
  t.kind = kind;
  t.list_kind = kind + "List";
  t.namespaced = namespaced;
  t.has_status = has_status;
  t.has_scale = has_scale;
  t.short_names = std::move(short_names);
  return t;
}

// Content compared for generation: everything but metadata and status.
json SpecContent(json object) {
  object.erase("metadata");
  object.erase("status");
  return object;
}

json WithoutVolatileMetadata(json object) {
  if (object.contains("metadata")) {
    for (const char* k : {"resourceVersion", "managedFields", "generation", "creationTimestamp", "uid"})
      object["metadata"].erase(k);
  }
  return object;
}

const std::regex& DnsSubdomain() {
  static const std::regex r(R"(^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$)");
  return r;
}

// What RBAC would check for a resource path (after /api/v1 or
// /apis/<group>/<version>), as kube-apiserver's RequestInfo parses it.
RequestRecord DescribeRequest(const std::string& method, const std::string& gv, std::vector<std::string> parts,
                              const std::map<std::string, std::string>& query, const std::string& user_agent) {
  RequestRecord rec;
  auto slash = gv.find('/');
  rec.group = slash == std::string::npos ? "" : gv.substr(0, slash);
  rec.version = slash == std::string::npos ? gv : gv.substr(slash + 1);
  rec.user_agent = user_agent;
  if (!parts.empty() && parts[0] == "namespaces" && parts.size() > 1) {
    rec.ns = parts[1];
    if (parts.size() > 2 && parts[2] != "status" && parts[2] != "finalize") parts.erase(parts.begin(), parts.begin() + 2);
  }
  if (!parts.empty()) rec.resource = parts[0];
  if (parts.size() > 1) rec.name = parts[1];
  if (parts.size() > 2) rec.subresource = parts[2];
  auto watch = query.find("watch");
  const bool watching = watch != query.end() && (watch->second == "true" || watch->second == "1");
  if (method == "GET") rec.verb = watching ? "watch" : rec.name.empty() ? "list" : "get";
  else if (method == "POST") rec.verb = "create";
  else if (method == "PUT") rec.verb = "update";
  else if (method == "PATCH") rec.verb = "patch";
  else if (method == "DELETE") rec.verb = rec.name.empty() ? "deletecollection" : "delete";
  else rec.verb = Lower(method);
  return rec;
}

}  // namespace

FakeApiServer::FakeApiServer(FakeApiServerOptions options)
    : options_(options), http_([this](const HttpRequest& r, HttpResponseWriter& w) { Handle(r, w); }) {
  types_.reserve(4096);
  std::vector<ResourceType> builtins = {
      Builtin("", "namespaces", "namespace", "Namespace", false, true, false, {"ns"}),
      Builtin("", "configmaps", "configmap", "ConfigMap", true, false, false, {"cm"}),
      Builtin("", "secrets", "secret", "Secret", true, false),
      Builtin("", "services", "service", "Service", true, true, false, {"svc"}),
      Builtin("", "pods", "pod", "Pod", true, true, false, {"po"}),
      Builtin("", "persistentvolumes", "persistentvolume", "PersistentVolume", false, true, false, {"pv"}),
      Builtin("", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true, true, false,
              {"pvc"}),
      Builtin("", "events", "event", "Event", true, false, false, {"ev"}),
      // Written by the pod runner's endpoints controller (pod_runner.hpp).
      Builtin("", "endpoints", "endpoints", "Endpoints", true, false, false, {"ep"}),
      Builtin("", "serviceaccounts", "serviceaccount", "ServiceAccount", true, false, false, {"sa"}),
      Builtin("apps", "statefulsets", "statefulset", "StatefulSet", true, true, true, {"sts"}),
      Builtin("apps", "deployments", "deployment", "Deployment", true, true, true, {"deploy"}),
      Builtin("policy", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", true, true, false,
              {"pdb"}),
      Builtin("coordination.k8s.io", "leases", "lease", "Lease", true, false),
      Builtin("networking.k8s.io", "networkpolicies", "networkpolicy", "NetworkPolicy", true, false, false, {"netpol"}),
      // What an installation (charts/moeserve) creates besides the above.
      Builtin("rbac.authorization.k8s.io", "clusterroles", "clusterrole", "ClusterRole", false, false),
      Builtin("rbac.authorization.k8s.io", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", false,
              false),
      Builtin("rbac.authorization.k8s.io", "roles", "role", "Role", true, false),
      Builtin("rbac.authorization.k8s.io", "rolebindings", "rolebinding", "RoleBinding", true, false),
      Builtin("admissionregistration.k8s.io", "validatingwebhookconfigurations", "validatingwebhookconfiguration",
              "ValidatingWebhookConfiguration", false, false),
      Builtin("apiextensions.k8s.io", "customresourcedefinitions", "customresourcedefinition",
              "CustomResourceDefinition", false, true, false, {"crd", "crds"}),
  };
  for (auto& t : builtins) types_.push_back(std::move(t));
  for (const char* ns : {"default", "kube-system", "kube-public"}) {
    (void)Create("namespaces", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }
}

FakeApiServer::~FakeApiServer() { Stop(); }

int FakeApiServer::Start(int port) { return http_.Start(port); }

void FakeApiServer::Stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lock(mu_);
    for (auto& w : watchers_) {
      std::lock_guard wl(w->mu);
      w->closed = true;
      w->cv.notify_all();
    }
  }
  http_.Stop();
}

std::string FakeApiServer::url() const { return "http://127.0.0.1:" + std::to_string(http_.port()); }

Status FakeApiServer::WriteKubeconfig(const std::string& path, const std::string& namespace_name) const {
  std::ofstream out(path);
  if (!out) return Fail(Error::Io("cannot write " + path));
  out << "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: " << url()
      << "\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n    namespace: "
      << namespace_name << "\ncurrent-context: fake\nusers:\n- name: tester\n  user:\n    token: fake-token\n";
  return Ok();
}

// ---------------------------------------------------------------------------
// Types

const ResourceType* FakeApiServer::FindType(const std::string& gv, const std::string& plural) const {
  for (const auto& t : types_)
    if (t.GroupVersion() == gv && t.plural == plural) return &t;
  return nullptr;
}

const ResourceType* FakeApiServer::FindTypeByQualified(const std::string& qualified) const {
  for (const auto& t : types_)
    if (t.Qualified() == qualified) return &t;
  return nullptr;
}

void FakeApiServer::RegisterCrdLocked(const json& crd) {
  const json& spec = crd["spec"];
  for (const auto& version : spec.value("versions", json::array())) {
    if (!version.value("served", true)) continue;
    ResourceType t;
    t.group = spec.value("group", "");
    t.version = version.value("name", "");
    const json& names = spec["names"];
    t.plural = names.value("plural", "");
    t.singular = names.value("singular", Lower(names.value("kind", "")));
    t.kind = names.value("kind", "");
    t.list_kind = names.value("listKind", t.kind + "List");
    t.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    t.custom = true;
    if (names.contains("shortNames")) t.short_names = names["shortNames"].get<std::vector<std::string>>();
    if (names.contains("categories")) t.categories = names["categories"].get<std::vector<std::string>>();
    json subresources = version.value("subresources", json::object());
    t.has_status = subresources.contains("status");
    if (subresources.contains("scale")) {
      t.has_scale = true;
      t.scale_spec_path = subresources["scale"].value("specReplicasPath", ".spec.replicas");
      t.scale_status_path = subresources["scale"].value("statusReplicasPath", ".status.replicas");
    }
    t.schema = version.contains("schema") ? version["schema"].value("openAPIV3Schema", json::object()) : json::object();
    t.printer_columns = version.value("additionalPrinterColumns", json::array());
    // Replaced in place, and types_ never reallocates (reserved), so a
    // ResourceType* taken by a request in flight stays valid.
    auto same = std::find_if(types_.begin(), types_.end(), [&](const ResourceType& o) {
      return o.Qualified() == t.Qualified() && o.version == t.version;
    });
    if (same != types_.end())
      *same = t;
    else if (types_.size() < types_.capacity())
      types_.push_back(t);
  }
}

Status FakeApiServer::RegisterCrd(const json& crd) {
  auto created = Create("customresourcedefinitions.apiextensions.k8s.io", crd);
  if (!created) return Fail(created.error());
  return Ok();
}

Status FakeApiServer::RegisterCrdFile(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(auto docs, LoadYamlFile(path));
  for (const auto& doc : docs) MOE_TRY(RegisterCrd(doc));
  return Ok();
}

// ---------------------------------------------------------------------------
// Storage

void FakeApiServer::Commit(const ResourceType& type, const std::string& event_type, json& object) {
  object["metadata"]["resourceVersion"] = std::to_string(++rv_);
  if (event_type == "DELETED")
    objects_[type.Qualified()].erase(ObjectKey(object));
  else
    objects_[type.Qualified()][ObjectKey(object)] = object;
  history_.push_back({rv_, type.Qualified(), event_type, object});
  while (history_.size() > options_.watch_history) {
    compacted_rv_ = history_.front().rv;
    history_.pop_front();
  }
  json event = {{"type", event_type}, {"object", object}};
  for (auto& w : watchers_) {
    if (w->resource != type.Qualified()) continue;
    if (!w->ns.empty() && object["metadata"].value("namespace", "") != w->ns) continue;
    if (!MatchesLabelSelector(object, w->label_selector) || !MatchesFieldSelector(object, w->field_selector)) continue;
    std::lock_guard wl(w->mu);
    w->events.push_back(event);
    w->cv.notify_all();
  }
  if (type.Qualified() == "customresourcedefinitions.apiextensions.k8s.io" && event_type != "DELETED")
    RegisterCrdLocked(object);
}

void FakeApiServer::RemoveLocked(const ResourceType& type, const std::string& key, json object) {
  (void)key;
  Commit(type, "DELETED", object);
  CollectGarbageLocked(object["metadata"].value("uid", ""));
}

void FakeApiServer::CollectGarbageLocked(const std::string& owner_uid) {
  if (owner_uid.empty()) return;
  for (const auto& type : std::vector<ResourceType>(types_)) {
    std::vector<json> dependents;
    for (const auto& [key, object] : objects_[type.Qualified()]) {
      for (const auto& ref : object["metadata"].value("ownerReferences", json::array()))
        if (ref.value("uid", "") == owner_uid) dependents.push_back(object);
    }
    for (auto& object : dependents) {
      if (!object["metadata"].value("finalizers", json::array()).empty()) {
        if (!object["metadata"].contains("deletionTimestamp")) {
          object["metadata"]["deletionTimestamp"] = NowRfc3339();
          object["metadata"]["deletionGracePeriodSeconds"] = 0;
          Commit(type, "MODIFIED", object);
        }
      } else {
        RemoveLocked(type, ObjectKey(object), object);
      }
    }
  }
}

bool FakeApiServer::InjectConflict(const ResourceType& type) {
  if (type.plural == "leases" || type.plural == "events") return false;
  ++write_count_;
  return faults_.conflict_every_nth_write > 0 && write_count_ % faults_.conflict_every_nth_write == 0;
}

void FakeApiServer::RecordManagedFields(json& object, const json& before, const std::string& manager,
                                        const std::string& operation, const std::string& api_version) {
  if (manager.empty()) return;
  FieldSet changed = ChangedLeafFields(WithoutVolatileMetadata(before), WithoutVolatileMetadata(object));
  json entries = object["metadata"].value("managedFields", json::array());
  json kept = json::array();
  FieldSet mine;
  for (auto& entry : entries) {
    FieldSet fields = FieldsV1ToFieldSet(entry.value("fieldsV1", json::object()));
    if (entry.value("manager", "") == manager && entry.value("operation", "") == operation) {
      mine = fields;
      continue;
    }
    for (const auto& f : changed) fields.erase(f);
    if (fields.empty()) continue;
    entry["fieldsV1"] = FieldSetToFieldsV1(fields);
    kept.push_back(entry);
  }
  mine.insert(changed.begin(), changed.end());
  for (auto it = mine.begin(); it != mine.end();) it = FieldAt(object, *it) ? std::next(it) : mine.erase(it);
  if (!mine.empty())
    kept.push_back({{"manager", manager}, {"operation", operation}, {"apiVersion", api_version},
                    {"time", NowRfc3339()}, {"fieldsType", "FieldsV1"}, {"fieldsV1", FieldSetToFieldsV1(mine)}});
  object["metadata"]["managedFields"] = kept;
}

// Defaulting, pruning and validation, as the apiserver does on every write.
Outcome FakeApiServer::Admit(const ResourceType& type, json& object, bool strict) {
  std::vector<FieldError> errors;
  const std::string name = object["metadata"].value("name", "");
  if (name.empty())
    errors.push_back({"metadata.name", "FieldValueRequired", "Required value: name or generateName is required"});
  else if (!std::regex_match(name, DnsSubdomain()) || name.size() > 253)
    errors.push_back({"metadata.name", "FieldValueInvalid",
                      "Invalid value: \"" + name +
                          "\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                          "'-' or '.', and must start and end with an alphanumeric character"});
  if (type.custom && type.schema.is_object() && !type.schema.empty()) {
    ApplyDefaults(type.schema, object);
    auto pruned = PruneUnknownFields(type.schema, object, "", true);
    if (strict && !pruned.empty()) {
      std::string list;
      for (const auto& p : pruned) list += (list.empty() ? "" : ", ") + std::string("unknown field \"") + p + "\"";
      return Failure(400, "BadRequest",
                     type.kind + " in version \"" + type.version + "\" cannot be handled as a " + type.kind +
                         ": strict decoding error: " + list);
    }
    json body = object;
    body.erase("metadata");
    auto more = ValidateAgainstSchema(type.schema, body, "");
    errors.insert(errors.end(), more.begin(), more.end());
  }
  if (type.kind == "Secret" && object.contains("stringData")) {
    for (auto& [k, v] : object["stringData"].items())
      if (v.is_string()) object["data"][k] = Base64Encode(v.get<std::string>());
    object.erase("stringData");
  }
  if (errors.empty()) return {200, nullptr};
  std::string message;
  json causes = json::array();
  for (const auto& e : errors) {
    message += (message.empty() ? "" : ", ") + e.field + ": " + e.detail;
    causes.push_back({{"reason", e.reason}, {"message", e.detail}, {"field", e.field}});
  }
  if (errors.size() > 1) message = "[" + message + "]";
  std::string qualified_kind = type.group.empty() ? type.kind : type.kind + "." + type.group;
  return Failure(422, "Invalid", qualified_kind + " \"" + name + "\" is invalid: " + message,
                 {{"name", name}, {"group", type.group}, {"kind", type.kind}, {"causes", causes}});
}

// ---------------------------------------------------------------------------
// Verbs (called with mu_ held)

Outcome FakeApiServer::DoGet(const Request& r) {
  auto& store = objects_[r.type->Qualified()];
  auto it = store.find(r.ns + "/" + r.name);
  if (it == store.end()) return NotFound(*r.type, r.name);
  return {200, it->second};
}

// Pages: `limit` objects at a time in key order, and a continue token
// naming where the next page starts and the resourceVersion of the first
// page. Unlike etcd, later pages show the current state rather than a
// snapshot; a token older than the kept history is 410 Expired, as etcd
// compaction makes it.
Outcome FakeApiServer::DoList(const Request& r) {
  int64_t limit = 0;
  try {
    if (!r.Query("limit").empty()) limit = std::stoll(r.Query("limit"));
  } catch (...) {
  }
  std::string start_after;
  std::string list_rv = std::to_string(rv_);
  if (!r.Query("continue").empty()) {
    json token = json::parse(r.Query("continue"), nullptr, false);
    if (!token.is_object()) return Failure(400, "BadRequest", "continue key is not valid");
    if (token.value("rv", int64_t{0}) < compacted_rv_)
      return Failure(410, "Expired",
                     "The provided continue parameter is too old to display a consistent list result. You can start "
                     "a new list without the continue parameter, or use the continue token in this response to "
                     "retrieve the remainder of the results. Continuing with the provided token results in an "
                     "inconsistent list - objects that were created, modified, or deleted between the time the first "
                     "chunk was returned and now may show up in the list.");
    start_after = token.value("start", "");
    list_rv = std::to_string(token.value("rv", rv_));
  }
  json items = json::array();
  std::string last_key;
  bool more = false;
  auto& store = objects_[r.type->Qualified()];
  for (auto it = start_after.empty() ? store.begin() : store.upper_bound(start_after); it != store.end(); ++it) {
    const json& object = it->second;
    if (!r.ns.empty() && object["metadata"].value("namespace", "") != r.ns) continue;
    if (!MatchesLabelSelector(object, r.Query("labelSelector"))) continue;
    if (!MatchesFieldSelector(object, r.Query("fieldSelector"))) continue;
    if (limit > 0 && static_cast<int64_t>(items.size()) == limit) {
      more = true;
      break;
    }
    items.push_back(object);
    last_key = it->first;
  }
  json meta = {{"resourceVersion", list_rv}};
  if (more) meta["continue"] = json({{"rv", std::stoll(list_rv)}, {"start", last_key}}).dump();
  return {200, {{"kind", r.type->list_kind}, {"apiVersion", r.type->GroupVersion()}, {"metadata", meta}, {"items", items}}};
}

Outcome FakeApiServer::DoCreate(const Request& r, json object) {
  const ResourceType& t = *r.type;
  if (!object.is_object()) return Failure(400, "BadRequest", "the body of the request was not a JSON object");
  json& meta = object["metadata"];
  if (!meta.is_object()) meta = json::object();
  if (t.namespaced) {
    std::string body_ns = meta.value("namespace", "");
    if (!body_ns.empty() && body_ns != r.ns)
      return Failure(400, "BadRequest",
                     "the namespace of the provided object does not match the namespace sent on the request");
    meta["namespace"] = r.ns;
    if (!objects_["namespaces"].count("/" + r.ns))
      return Failure(404, "NotFound", "namespaces \"" + r.ns + "\" not found",
                     {{"name", r.ns}, {"kind", "namespaces"}});
  } else {
    meta.erase("namespace");
  }
  if (meta.value("name", "").empty() && !meta.value("generateName", "").empty()) {
    static std::mt19937 rng(42);
    std::string suffix;
    for (int i = 0; i < 5; ++i) suffix.push_back("bcdfghjklmnpqrstvwxz2456789"[rng() % 27]);
    meta["name"] = meta["generateName"].get<std::string>() + suffix;
  }
  object["apiVersion"] = t.GroupVersion();
  object["kind"] = t.kind;
  if (t.has_status) object.erase("status");
  if (t.kind == "Namespace") object["status"] = {{"phase", "Active"}};
  Outcome admitted = Admit(t, object, r.Query("fieldValidation") == "Strict");
  if (admitted.code != 200) return admitted;
  const std::string name = meta.value("name", "");
  if (objects_[t.Qualified()].count(ObjectKey(object)))
    return Failure(409, "AlreadyExists", t.Qualified() + " \"" + name + "\" already exists",
                   {{"name", name}, {"group", t.group}, {"kind", t.plural}});
  meta["uid"] = "00000000-0000-4000-8000-" + [&] {
    char buf[16];
    snprintf(buf, sizeof buf, "%012llx", static_cast<unsigned long long>(++uid_counter_));
    return std::string(buf);
  }();
  meta["creationTimestamp"] = NowRfc3339();
  meta.erase("deletionTimestamp");
  meta.erase("managedFields");
  if (t.has_status || t.custom) meta["generation"] = 1;
  std::string manager = r.Query("fieldManager");
  if (manager.empty()) manager = r.user_agent.substr(0, r.user_agent.find('/'));
  RecordManagedFields(object, json::object(), manager, r.content_type.find("apply-patch") != std::string::npos ? "Apply" : "Update",
                      t.GroupVersion());
  if (r.Query("dryRun") == "All") return {201, object};
  if (t.kind == "CustomResourceDefinition") {
    object["status"] = {{"conditions", json::array({{{"type", "Established"}, {"status", "True"}, {"reason", "InitialNamesAccepted"}, {"message", "the initial names have been accepted"}, {"lastTransitionTime", NowRfc3339()}},
                                                    {{"type", "NamesAccepted"}, {"status", "True"}, {"reason", "NoConflicts"}, {"message", "no conflicts found"}, {"lastTransitionTime", NowRfc3339()}}})},
                        {"acceptedNames", object["spec"]["names"]},
                        {"storedVersions", json::array({object["spec"]["versions"][0].value("name", "")})}};
  }
  Commit(t, "ADDED", object);
  return {201, object};
}

Outcome FakeApiServer::DoUpdate(const Request& r, json object, bool from_patch) {
  const ResourceType& t = *r.type;
  auto& store = objects_[t.Qualified()];
  auto it = store.find(r.ns + "/" + r.name);
  if (it == store.end()) return NotFound(t, r.name);
  const json existing = it->second;
  if (!object.is_object() || !object["metadata"].is_object())
    return Failure(400, "BadRequest", "the body of the request was not a Kubernetes object");
  std::string given_rv = object["metadata"].value("resourceVersion", "");
  if (!given_rv.empty() && given_rv != existing["metadata"].value("resourceVersion", ""))
    return ConflictOutcome(t, r.name);
  if (object["metadata"].value("name", r.name) != r.name)
    return Failure(400, "BadRequest", "the name of the object (" + object["metadata"].value("name", "") +
                                          ") does not match the name on the URL (" + r.name + ")");
  json updated;
  if (r.subresource == "status") {
    updated = existing;
    if (object.contains("status"))
      updated["status"] = object["status"];
    else
      updated.erase("status");
  } else {
    updated = object;
    json& meta = updated["metadata"];
    for (const char* k : {"uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                          "namespace", "managedFields"}) {
      if (existing["metadata"].contains(k))
        meta[k] = existing["metadata"][k];
      else
        meta.erase(k);
    }
    meta["name"] = r.name;
    updated["apiVersion"] = t.GroupVersion();
    updated["kind"] = t.kind;
    if (t.has_status) {
      if (existing.contains("status"))
        updated["status"] = existing["status"];
      else
        updated.erase("status");
    }
  }
  Outcome admitted = Admit(t, updated, r.Query("fieldValidation") == "Strict");
  if (admitted.code != 200) return admitted;
  if (r.subresource != "status" && (t.has_status || t.custom) && SpecContent(updated) != SpecContent(existing))
    updated["metadata"]["generation"] = existing["metadata"].value("generation", 0) + 1;
  updated["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"];
  std::string manager = r.Query("fieldManager");
  if (manager.empty()) manager = r.user_agent.substr(0, r.user_agent.find('/'));
  if (!(from_patch && r.content_type.find("apply-patch") != std::string::npos))
    RecordManagedFields(updated, existing, manager, "Update", t.GroupVersion());
  // A write that changes nothing is not a write: same resourceVersion, no event.
  if (updated == existing) return {200, existing};
  if (r.Query("dryRun") == "All") return {200, updated};
  if (updated["metadata"].contains("deletionTimestamp") &&
      updated["metadata"].value("finalizers", json::array()).empty()) {
    RemoveLocked(t, r.ns + "/" + r.name, updated);
    return {200, updated};
  }
  Commit(t, "MODIFIED", updated);
  return {200, updated};
}

Outcome FakeApiServer::DoPatch(const Request& r) {
  const ResourceType& t = *r.type;
  auto& store = objects_[t.Qualified()];
  auto it = store.find(r.ns + "/" + r.name);
  const bool apply = r.content_type.find("application/apply-patch") != std::string::npos;
  json patch;
  if (apply) {
    auto parsed = YamlToJson(r.body);
    if (!parsed) return Failure(400, "BadRequest", parsed.error().message());
    patch = *parsed;
  } else {
    patch = json::parse(r.body, nullptr, false);
    if (patch.is_discarded()) return Failure(400, "BadRequest", "the body of the request was not valid JSON");
  }
  if (it == store.end()) {
    if (!apply) return NotFound(t, r.name);
    if (r.Query("fieldManager").empty())
      return Failure(400, "BadRequest", "PATCH " + t.plural + ": fieldManager is required for apply requests");
    Request create = r;
    patch["metadata"]["name"] = r.name;
    return DoCreate(create, patch);
  }
  json current = it->second;
  std::string ct = r.content_type.substr(0, r.content_type.find(';'));
  if (ct == "application/merge-patch+json") {
    current.merge_patch(patch);
  } else if (ct == "application/json-patch+json") {
    try {
      current = current.patch(patch);
    } catch (const std::exception& e) {
      return Failure(422, "Invalid", std::string("the server rejected our request due to an error in our request: ") + e.what());
    }
  } else if (ct == "application/strategic-merge-patch+json") {
    if (t.custom)
      return Failure(415, "UnsupportedMediaType",
                     "the body of the request was in an unknown format - accepted media types include: "
                     "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml");
    StrategicMergePatch(current, patch);
  } else if (apply) {
    const std::string manager = r.Query("fieldManager");
    if (manager.empty())
      return Failure(400, "BadRequest", "PATCH " + t.plural + ": fieldManager is required for apply requests");
    json applied = patch;
    applied["metadata"].erase("resourceVersion");
    FieldSet applied_fields = LeafFields(applied);
    for (const char* f : {"apiVersion", "kind", "metadata\x1fname", "metadata\x1fnamespace"}) applied_fields.erase(f);
    // Fields this manager applied before, and fields others own.
    FieldSet previous;
    std::vector<std::pair<std::string, FieldSet>> others;
    for (const auto& entry : current["metadata"].value("managedFields", json::array())) {
      FieldSet fields = FieldsV1ToFieldSet(entry.value("fieldsV1", json::object()));
      if (entry.value("manager", "") == manager && entry.value("operation", "") == "Apply")
        previous = fields;
      else
        others.push_back({entry.value("manager", ""), fields});
    }
    const bool force = r.Query("force") == "true";
    std::vector<std::string> conflicts;
    for (const auto& f : applied_fields) {
      const json* have = FieldAt(current, f);
      const json* want = FieldAt(applied, f);
      if (!have || !want || *have == *want) continue;
      for (const auto& [other, fields] : others)
        if (fields.count(f)) conflicts.push_back("conflict with \"" + other + "\": " + FieldDisplay(f));
    }
    if (!conflicts.empty() && !force) {
      std::string message = "Apply failed with " + std::to_string(conflicts.size()) + " conflict" +
                            (conflicts.size() == 1 ? "" : "s") + ": ";
      for (size_t i = 0; i < conflicts.size(); ++i) message += (i ? "\n" : "") + conflicts[i];
      return Failure(409, "Conflict", message, {{"name", r.name}, {"group", t.group}, {"kind", t.plural}});
    }
    for (const auto& f : previous) {
      if (applied_fields.count(f)) continue;
      bool owned_elsewhere = false;
      for (const auto& [other, fields] : others) owned_elsewhere = owned_elsewhere || fields.count(f);
      if (!owned_elsewhere) RemoveField(current, f);
    }
    const json before = current;
    json to_merge = applied;
    to_merge.erase("apiVersion");
    to_merge.erase("kind");
    current.merge_patch(to_merge);
    // Ownership: this manager owns exactly what it applied; forced fields leave others.
    json entries = json::array();
    for (auto& [other, fields] : others) {
      for (const auto& f : applied_fields) fields.erase(f);
      if (fields.empty()) continue;
      for (const auto& entry : before["metadata"].value("managedFields", json::array())) {
        if (entry.value("manager", "") == other && !(other == manager && entry.value("operation", "") == "Apply")) {
          json e = entry;
          e["fieldsV1"] = FieldSetToFieldsV1(fields);
          entries.push_back(e);
          break;
        }
      }
    }
    entries.push_back({{"manager", manager}, {"operation", "Apply"}, {"apiVersion", t.GroupVersion()},
                       {"time", NowRfc3339()}, {"fieldsType", "FieldsV1"},
                       {"fieldsV1", FieldSetToFieldsV1(applied_fields)}});
    current["metadata"]["managedFields"] = entries;
    current["metadata"]["resourceVersion"] = it->second["metadata"]["resourceVersion"];
    Request update = r;
    // managedFields were set above; DoUpdate keeps the stored ones, so store ours first.
    json stored = it->second;
    it->second["metadata"]["managedFields"] = entries;
    Outcome o = DoUpdate(update, current, true);
    if (o.code != 200) it->second = stored;
    return o;
  } else {
    return Failure(415, "UnsupportedMediaType", "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json");
  }
  return DoUpdate(r, current, true);
}

Outcome FakeApiServer::DoDelete(const Request& r) {
  const ResourceType& t = *r.type;
  auto& store = objects_[t.Qualified()];
  auto it = store.find(r.ns + "/" + r.name);
  if (it == store.end()) return NotFound(t, r.name);
  json object = it->second;
  json options = json::parse(r.body.empty() ? "{}" : r.body, nullptr, false);
  if (options.is_object() && options.contains("preconditions")) {
    std::string want = options["preconditions"].value("resourceVersion", "");
    if (!want.empty() && want != object["metadata"].value("resourceVersion", "")) return ConflictOutcome(t, r.name);
    std::string want_uid = options["preconditions"].value("uid", "");
    if (!want_uid.empty() && want_uid != object["metadata"].value("uid", "")) return ConflictOutcome(t, r.name);
  }
  if (r.Query("dryRun") == "All") return {200, object};
  if (!object["metadata"].value("finalizers", json::array()).empty()) {
    if (!object["metadata"].contains("deletionTimestamp")) {
      object["metadata"]["deletionTimestamp"] = NowRfc3339();
      object["metadata"]["deletionGracePeriodSeconds"] = 0;
      Commit(t, "MODIFIED", object);
    }
    return {200, object};
  }
  std::string policy = options.is_object() ? options.value("propagationPolicy", "Background") : "Background";
  Commit(t, "DELETED", object);
  if (t.kind == "Namespace") {
    // The namespace controller's job, done at once: everything in it goes.
    for (const auto& type : std::vector<ResourceType>(types_)) {
      if (!type.namespaced) continue;
      std::vector<json> inside;
      for (const auto& [key, o] : objects_[type.Qualified()])
        if (o["metadata"].value("namespace", "") == r.name) inside.push_back(o);
      for (auto& o : inside) Commit(type, "DELETED", o);
    }
  }
  if (policy != "Orphan") CollectGarbageLocked(object["metadata"].value("uid", ""));
  return {200, object};
}

Outcome FakeApiServer::DoScale(const Request& r) {
  const ResourceType& t = *r.type;
  if (!t.has_scale) return Failure(404, "NotFound", "the server could not find the requested resource");
  auto& store = objects_[t.Qualified()];
  auto it = store.find(r.ns + "/" + r.name);
  if (it == store.end()) return NotFound(t, r.name);
  auto at = [](const json& o, const std::string& path) { return EvalJsonPath(o, path); };
  auto scale_of = [&](const json& o) {
    json spec_replicas = at(o, t.scale_spec_path);
    json status_replicas = at(o, t.scale_status_path);
    return json{{"kind", "Scale"},
                {"apiVersion", "autoscaling/v1"},
                {"metadata",
                 {{"name", r.name},
                  {"namespace", r.ns},
                  {"uid", o["metadata"]["uid"]},
                  {"resourceVersion", o["metadata"]["resourceVersion"]},
                  {"creationTimestamp", o["metadata"]["creationTimestamp"]}}},
                {"spec", {{"replicas", spec_replicas.is_null() ? json(0) : spec_replicas}}},
                {"status", {{"replicas", status_replicas.is_null() ? json(0) : status_replicas}, {"selector", ""}}}};
  };
  json scale = scale_of(it->second);
  if (r.method == "GET") return {200, scale};
  json body = json::parse(r.body, nullptr, false);
  if (body.is_discarded()) return Failure(400, "BadRequest", "the body of the request was not valid JSON");
  if (r.method == "PATCH")
    scale.merge_patch(body);
  else
    scale = body;
  json updated = it->second;
  // The spec path is ".spec.replicas"-like: walk it.
  json* node = &updated;
  std::stringstream ss(t.scale_spec_path.substr(1));
  std::string part;
  while (std::getline(ss, part, '.')) node = &(*node)[part];
  *node = scale["spec"]["replicas"];
  std::string rv = scale["metadata"].value("resourceVersion", "");
  if (!rv.empty()) updated["metadata"]["resourceVersion"] = rv;
  Request main = r;
  main.subresource = "";
  Outcome o = DoUpdate(main, updated, true);
  if (o.code != 200) return o;
  return {200, scale_of(o.body)};
}

Outcome FakeApiServer::Dispatch(const Request& r) {
  const bool collection = r.name.empty();
  if (r.method == "GET") return collection ? DoList(r) : (r.subresource == "scale" ? DoScale(r) : DoGet(r));
  if (r.method == "POST" && r.subresource == "token" && r.type->plural == "serviceaccounts") {
    auto& accounts = objects_["serviceaccounts"];
    auto it = accounts.find(r.ns + "/" + r.name);
    TokenOutcome t = token_api_.Request(r.ns, r.name, it == accounts.end() ? json() : it->second, r.body);
    return {t.code, t.body};
  }
  const bool write = r.method == "POST" || r.method == "PUT" || r.method == "PATCH";
  if (write && !r.admission_pass && InjectConflict(*r.type)) return ConflictOutcome(*r.type, r.name);
  if (r.method == "POST" && collection) {
    json body = json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return Failure(400, "BadRequest", "the body of the request was not valid JSON");
    return DoCreate(r, body);
  }
  if (collection && r.method == "DELETE") {
    // deletecollection: every object matching the selectors, each as DELETE would.
    json deleted = json::array();
    // The list kept in a variable: a range-for over DoList(r).body["items"]
    // would iterate a destroyed temporary.
    const Outcome listed = DoList(r);
    for (const auto& item : listed.body["items"]) {
      Request one = r;
      one.ns = item["metadata"].value("namespace", "");
      one.name = item["metadata"].value("name", "");
      one.body.clear();
      Outcome o = DoDelete(one);
      if (o.code == 200) deleted.push_back(o.body);
    }
    return {200, {{"kind", r.type->list_kind}, {"apiVersion", r.type->GroupVersion()},
                  {"metadata", {{"resourceVersion", std::to_string(rv_)}}}, {"items", deleted}}};
  }
  if (collection) return Failure(405, "MethodNotAllowed", "the server does not allow this method on the requested resource");
  if (r.subresource == "scale") return DoScale(r);
  if (!r.subresource.empty() && r.subresource != "status")
    return Failure(404, "NotFound", "the server could not find the requested resource");
  if (r.subresource == "status" && !r.type->has_status)
    return Failure(404, "NotFound", "the server could not find the requested resource");
  if (r.method == "PUT") {
    json body = json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return Failure(400, "BadRequest", "the body of the request was not valid JSON");
    return DoUpdate(r, body, false);
  }
  if (r.method == "PATCH") return DoPatch(r);
  if (r.method == "DELETE") return DoDelete(r);
  return Failure(405, "MethodNotAllowed", "the server does not allow this method on the requested resource");
}

std::optional<Outcome> FakeApiServer::RunAdmission(const Request& r, std::string* judged_rv) {
  *judged_rv = "-";  // nothing judged
  const bool write = r.method == "POST" || r.method == "PUT" || r.method == "PATCH";
  if (!write || r.subresource == "status" || (r.method == "POST" && !r.name.empty())) return std::nullopt;
  static const std::string kConfigs = "validatingwebhookconfigurations.admissionregistration.k8s.io";
  std::vector<json> configs;
  AdmissionAttributes a;
  {
    std::lock_guard lock(mu_);
    // As kube-apiserver: webhook configurations themselves are never sent to webhooks.
    if (r.type->Qualified() == kConfigs) return std::nullopt;
    for (const auto& [key, config] : objects_[kConfigs]) configs.push_back(config);
    if (configs.empty()) return std::nullopt;
    Request dry = r;
    dry.query["dryRun"] = "All";
    dry.admission_pass = true;
    Outcome result = Dispatch(dry);
    if (result.code >= 300) return std::nullopt;  // the write itself fails the same way
    const std::string name = r.name.empty() ? result.body["metadata"].value("name", "") : r.name;
    auto& store = objects_[r.type->Qualified()];
    auto it = store.find(r.ns + "/" + name);
    *judged_rv = it == store.end() ? "" : it->second["metadata"].value("resourceVersion", "");
    a.group = r.type->group;
    a.version = r.type->version;
    a.resource = r.type->plural;
    a.subresource = r.subresource;
    a.operation = it == store.end() ? "CREATE" : "UPDATE";
    a.ns = r.ns;
    a.name = name;
    a.username = r.user_agent.substr(0, r.user_agent.find('/'));
    a.dry_run = r.Query("dryRun") == "All";
    a.object = result.body;
    if (r.subresource == "scale") {
      a.kind_group = "autoscaling";
      a.kind_version = "v1";
      a.kind = "Scale";
      if (it != store.end()) {
        const json replicas = EvalJsonPath(it->second, r.type->scale_spec_path);
        a.old_object = {{"kind", "Scale"},
                        {"apiVersion", "autoscaling/v1"},
                        {"metadata", {{"name", name}, {"namespace", r.ns}, {"uid", it->second["metadata"]["uid"]},
                                      {"resourceVersion", it->second["metadata"]["resourceVersion"]}}},
                        {"spec", {{"replicas", replicas.is_null() ? json(0) : replicas}}}};
      }
    } else {
      a.kind_group = r.type->group;
      a.kind_version = r.type->version;
      a.kind = r.type->kind;
      if (it != store.end()) a.old_object = it->second;
    }
  }
  AdmissionVerdict verdict = admission_.Admit(configs, a);
  if (verdict.allowed) return std::nullopt;
  return Failure(verdict.code, verdict.reason, verdict.message);
}

// ---------------------------------------------------------------------------
// Discovery and OpenAPI

Outcome FakeApiServer::Discovery(const HttpRequest& req, bool* handled) {
  *handled = true;
  std::lock_guard lock(mu_);
  const std::string& p = req.path;
  auto resource_list = [&](const std::string& gv) {
    json resources = json::array();
    for (const auto& t : types_) {
      if (t.GroupVersion() != gv) continue;
      resources.push_back({{"name", t.plural},
                           {"singularName", t.singular},
                           {"namespaced", t.namespaced},
                           {"kind", t.kind},
                           {"verbs", {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}},
                           {"shortNames", t.short_names},
                           {"categories", t.categories},
                           {"storageVersionHash", "fake"}});
      if (t.has_status)
        resources.push_back({{"name", t.plural + "/status"}, {"singularName", ""}, {"namespaced", t.namespaced},
                             {"kind", t.kind}, {"verbs", {"get", "patch", "update"}}});
      if (t.has_scale)
        resources.push_back({{"name", t.plural + "/scale"}, {"singularName", ""}, {"namespaced", t.namespaced},
                             {"group", "autoscaling"}, {"version", "v1"}, {"kind", "Scale"},
                             {"verbs", {"get", "patch", "update"}}});
    }
    return json{{"kind", "APIResourceList"}, {"apiVersion", "v1"}, {"groupVersion", gv}, {"resources", resources}};
  };
  auto group_of = [&](const std::string& g) {
    json versions = json::array();
    for (const auto& t : types_) {
      if (t.group != g) continue;
      json v = {{"groupVersion", t.GroupVersion()}, {"version", t.version}};
      if (std::find(versions.begin(), versions.end(), v) == versions.end()) versions.push_back(v);
    }
    return json{{"kind", "APIGroup"}, {"apiVersion", "v1"}, {"name", g}, {"versions", versions},
                {"preferredVersion", versions.empty() ? json::object() : versions[0]}};
  };
  if (p == "/version")
    return {200,
            {{"major", "1"}, {"minor", "32"}, {"gitVersion", "v1.32.0-moeserve-fake"}, {"gitCommit", "0000000"},
             {"gitTreeState", "clean"}, {"buildDate", "2025-01-01T00:00:00Z"}, {"goVersion", "go1.23.0"},
             {"compiler", "gc"}, {"platform", "linux/amd64"}}};
  if (p == "/healthz" || p == "/readyz" || p == "/livez") return {200, "ok"};
  if (p == "/api")
    return {200,
            {{"kind", "APIVersions"}, {"versions", {"v1"}},
             {"serverAddressByClientCIDRs", {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1:" + std::to_string(http_.port())}}}}}};
  if (p == "/api/v1") return {200, resource_list("v1")};
  if (p == "/apis") {
    json groups = json::array();
    std::vector<std::string> seen;
    for (const auto& t : types_) {
      if (t.group.empty() || std::find(seen.begin(), seen.end(), t.group) != seen.end()) continue;
      seen.push_back(t.group);
      json g = group_of(t.group);
      g.erase("kind");
      g.erase("apiVersion");
      groups.push_back(g);
    }
    return {200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}}};
  }
  if (p.rfind("/apis/", 0) == 0) {
    std::string rest = p.substr(6);
    auto slash = rest.find('/');
    if (slash == std::string::npos) {
      json g = group_of(rest);
      if (g["versions"].empty()) return Failure(404, "NotFound", "the server could not find the requested resource");
      return {200, g};
    }
    if (rest.find('/', slash + 1) == std::string::npos) {
      json list = resource_list(rest);
      if (list["resources"].empty()) return Failure(404, "NotFound", "the server could not find the requested resource");
      return {200, list};
    }
  }
  *handled = false;
  return {};
}

Outcome FakeApiServer::OpenApi(const HttpRequest& req, bool* handled) {
  *handled = true;
  std::lock_guard lock(mu_);
  const std::string& p = req.path;
  std::vector<std::string> gvs;
  for (const auto& t : types_)
    if (std::find(gvs.begin(), gvs.end(), t.GroupVersion()) == gvs.end()) gvs.push_back(t.GroupVersion());
  auto doc_path = [](const std::string& gv) { return gv == "v1" ? std::string("api/v1") : "apis/" + gv; };
  if (p == "/openapi/v3") {
    json paths = json::object();
    for (const auto& gv : gvs)
      paths[doc_path(gv)] = {{"serverRelativeURL", "/openapi/v3/" + doc_path(gv) + "?hash=" + std::to_string(types_.size())}};
    return {200, {{"paths", paths}}};
  }
  if (p.rfind("/openapi/v3/", 0) == 0) {
    std::string want = p.substr(std::string("/openapi/v3/").size());
    for (const auto& gv : gvs) {
      if (doc_path(gv) != want) continue;
      json paths = json::object();
      json schemas = json::object();
      for (const auto& t : types_) {
        if (t.GroupVersion() != gv) continue;
        json gvk = {{"group", t.group}, {"version", t.version}, {"kind", t.kind}};
        std::string base = "/" + doc_path(gv) + (t.namespaced ? "/namespaces/{namespace}/" : "/") + t.plural;
        json params = json::array({{{"name", "fieldValidation"}, {"in", "query"},
                                    {"description", "Strict, Warn or Ignore unknown and duplicate fields"},
                                    {"schema", {{"type", "string"}, {"uniqueItems", true}}}},
                                   {{"name", "fieldManager"}, {"in", "query"}, {"schema", {{"type", "string"}, {"uniqueItems", true}}}},
                                   {{"name", "dryRun"}, {"in", "query"}, {"schema", {{"type", "string"}, {"uniqueItems", true}}}}});
        json content_types = {{"application/json-patch+json", {{"schema", {{"type", "object"}}}}},
                              {"application/merge-patch+json", {{"schema", {{"type", "object"}}}}},
                              {"application/apply-patch+yaml", {{"schema", {{"type", "object"}}}}}};
        std::string schema_name = (t.group.empty() ? "io.k8s.api.core" : t.group) + "." + t.version + "." + t.kind;
        json ref = {{"$ref", "#/components/schemas/" + schema_name}};
        json ok = {{"200", {{"description", "OK"}, {"content", {{"application/json", {{"schema", ref}}}}}}}};
        paths[base + "/{name}"] = {
            {"get", {{"operationId", "read" + t.kind}, {"x-kubernetes-action", "get"}, {"x-kubernetes-group-version-kind", gvk}, {"responses", ok}}},
            {"put", {{"operationId", "replace" + t.kind}, {"x-kubernetes-action", "put"}, {"x-kubernetes-group-version-kind", gvk}, {"parameters", params},
                     {"requestBody", {{"content", {{"application/json", {{"schema", ref}}}}}}}, {"responses", ok}}},
            {"patch", {{"operationId", "patch" + t.kind}, {"x-kubernetes-action", "patch"}, {"x-kubernetes-group-version-kind", gvk}, {"parameters", params},
                       {"requestBody", {{"content", content_types}}}, {"responses", ok}}},
            {"delete", {{"operationId", "delete" + t.kind}, {"x-kubernetes-action", "delete"}, {"x-kubernetes-group-version-kind", gvk}, {"responses", ok}}}};
        paths[base] = {{"post", {{"operationId", "create" + t.kind}, {"x-kubernetes-action", "post"}, {"x-kubernetes-group-version-kind", gvk}, {"parameters", params},
                                 {"requestBody", {{"content", {{"application/json", {{"schema", ref}}}}}}}, {"responses", ok}}}};
        json schema = t.custom ? t.schema : json{{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}};
        schema["x-kubernetes-group-version-kind"] = json::array({gvk});
        schemas[schema_name] = schema;
      }
      return {200,
              {{"openapi", "3.0.0"}, {"info", {{"title", "Kubernetes"}, {"version", "v1.32.0"}}}, {"paths", paths},
               {"components", {{"schemas", schemas}}}}};
    }
    return Failure(404, "NotFound", "the server could not find the requested resource");
  }
  if (p.rfind("/openapi/v2", 0) == 0) return Failure(404, "NotFound", "the server could not find the requested resource");
  *handled = false;
  return {};
}

// ---------------------------------------------------------------------------
// HTTP

void FakeApiServer::Handle(const HttpRequest& hr, HttpResponseWriter& writer) {
  std::string auth = hr.Header("authorization");
  if (auth.rfind("Bearer ", 0) == 0) {
    std::lock_guard lock(mu_);
    last_token_ = auth.substr(7);
  }
  auto send = [&](const Outcome& o) {
    writer.Send(o.code, o.body.is_string() ? "text/plain" : "application/json",
                o.body.is_string() ? o.body.get<std::string>() : o.body.dump());
  };
  if (hr.method == "POST" && hr.path == "/apis/authentication.k8s.io/v1/tokenreviews") {
    std::unique_lock lock(mu_);
    TokenOutcome t = token_api_.Review(hr.body, [this](const std::string& ns, const std::string& name) {
      auto& accounts = objects_["serviceaccounts"];
      auto it = accounts.find(ns + "/" + name);
      return it == accounts.end() ? std::string() : it->second["metadata"].value("uid", "");
    });
    lock.unlock();
    return send({t.code, t.body});
  }
  bool handled = false;
  Outcome o = Discovery(hr, &handled);
  if (handled) return send(o);
  o = OpenApi(hr, &handled);
  if (handled) return send(o);

  // /api/v1/... or /apis/<group>/<version>/...
  std::vector<std::string> segs;
  {
    std::stringstream ss(hr.path);
    std::string s;
    while (std::getline(ss, s, '/'))
      if (!s.empty()) segs.push_back(s);
  }
  std::string gv;
  size_t at = 0;
  if (segs.size() >= 2 && segs[0] == "api") {
    gv = segs[1];
    at = 2;
  } else if (segs.size() >= 3 && segs[0] == "apis") {
    gv = segs[1] + "/" + segs[2];
    at = 3;
  } else {
    return send(Failure(404, "NotFound", "the server could not find the requested resource"));
  }
  std::vector<std::string> rest(segs.begin() + at, segs.end());
  RequestRecord record = DescribeRequest(hr.method, gv, rest, hr.query, hr.Header("user-agent"));
  Request r;
  r.method = hr.method;
  r.query = hr.query;
  r.body = hr.body;
  r.content_type = hr.Header("content-type");
  r.accept = hr.Header("accept");
  r.user_agent = hr.Header("user-agent");
  // kubectl's typed commands (create namespace, create secret, ...) send
  // protobuf and do not retry as JSON on a 415: read what they send.
  if ((r.method == "POST" || r.method == "PUT") && IsKubernetesProtobuf(r.content_type)) {
    auto decoded = DecodeKubernetesProtobuf(r.body);
    if (!decoded) {
      record.status = 415;
      std::lock_guard lock(mu_);
      requests_.push_back(record);
      return send(Failure(415, "UnsupportedMediaType", decoded.error().message()));
    }
    r.body = decoded->dump();
    r.content_type = "application/json";
  }
  {
    std::lock_guard lock(mu_);
    if (rest.size() >= 3 && rest[0] == "namespaces") {
      const ResourceType* t = FindType(gv, rest[2]);
      if (t && t->namespaced) {
        r.type = t;
        r.ns = rest[1];
        if (rest.size() > 3) r.name = rest[3];
        if (rest.size() > 4) r.subresource = rest[4];
      }
    }
    if (!r.type && !rest.empty()) {
      const ResourceType* t = FindType(gv, rest[0]);
      if (t) {
        r.type = t;
        if (rest.size() > 1) r.name = rest[1];
        if (rest.size() > 2) r.subresource = rest[2];
      }
    }
  }
  if (!r.type) {
    record.status = 404;
    std::lock_guard lock(mu_);
    requests_.push_back(record);
    return send(Failure(404, "NotFound", "the server could not find the requested resource"));
  }

  const std::string watch = r.Query("watch");
  if (r.method == "GET" && r.name.empty() && (watch == "true" || watch == "1")) {
    {
      std::lock_guard lock(mu_);
      requests_.push_back(record);
    }
    return HandleWatch(r, writer);
  }

  int stall_ms = 0;
  {
    std::lock_guard lock(mu_);
    if (!faults_.stall_resource.empty() && faults_.stall_resource == r.type->plural) stall_ms = faults_.stall_ms;
  }
  const auto stall_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(stall_ms);
  while (!stopping_ && std::chrono::steady_clock::now() < stall_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  // Validating admission, as kube-apiserver runs it after its own checks: a
  // refusal ends the write; otherwise it goes on, unless the object changed
  // while the webhooks judged it (then they judge the new state).
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::string judged_rv;
    if (auto refused = RunAdmission(r, &judged_rv)) {
      std::lock_guard lock(mu_);
      record.status = refused->code;
      requests_.push_back(record);
      writes_.push_back({r.method, hr.path, r.user_agent, refused->code, r.body, std::chrono::steady_clock::now()});
      return send(*refused);
    }
    std::lock_guard lock(mu_);
    auto& store = objects_[r.type->Qualified()];
    auto it = r.name.empty() ? store.end() : store.find(r.ns + "/" + r.name);
    const std::string now_rv = it == store.end() ? "" : it->second["metadata"].value("resourceVersion", "");
    if (now_rv == judged_rv || judged_rv == "-") break;
  }
  if (r.method == "GET" && r.type->plural == "pods" && r.type->group.empty() && r.subresource == "log") {
    PodLogReader reader;
    {
      std::lock_guard lock(mu_);
      reader = log_reader_;
      record.status = 200;
      requests_.push_back(record);
    }
    auto text = reader ? reader(r.ns, r.name, r.Query("container"), r.Query("previous") == "true")
                       : Result<std::string>(Fail(Error::NotFound("no pod runner serves logs on this API server")));
    if (!text) return send(Failure(text.error().code() == ErrorCode::kNotFound ? 404 : 400,
                                   text.error().code() == ErrorCode::kNotFound ? "NotFound" : "BadRequest",
                                   text.error().message()));
    return writer.Send(200, "text/plain", *text);
  }
  {
    std::lock_guard lock(mu_);
    o = Dispatch(r);
    record.status = o.code;
    requests_.push_back(record);
    if (r.method != "GET")
      writes_.push_back({r.method, hr.path, r.user_agent, o.code, r.body, std::chrono::steady_clock::now()});
    if (r.method == "GET" && o.code == 200 && r.accept.find("as=Table") != std::string::npos) {
      std::vector<json> objects;
      std::string list_rv = std::to_string(rv_);
      if (r.name.empty()) {
        for (const auto& item : o.body["items"]) objects.push_back(item);
      } else {
        objects.push_back(o.body);
      }
      o.body = ToTable(*r.type, objects, list_rv, r.Query("includeObject") == "Object");
    }
  }
  send(o);
}

json FakeApiServer::ToTable(const ResourceType& type, const std::vector<json>& objects, const std::string& list_rv,
                            bool include_object) {
  json columns = json::array({{{"name", "Name"}, {"type", "string"}, {"format", "name"},
                               {"description", "Name must be unique within a namespace."}, {"priority", 0}}});
  json printer = type.printer_columns;
  if (printer.empty() || !type.custom) printer = BuiltinPrinterColumns(type);
  for (const auto& c : printer)
    columns.push_back({{"name", c.value("name", "")}, {"type", c.value("type", "string") == "date" ? "date" : c.value("type", "string")},
                       {"format", c.value("format", "")}, {"description", c.value("description", "")},
                       {"priority", c.value("priority", 0)}});
  json rows = json::array();
  const int64_t now = ParseRfc3339(NowRfc3339());
  for (const auto& object : objects) {
    json cells = json::array({object["metadata"].value("name", "")});
    for (const auto& c : printer) {
      json v = c.contains("compute") ? BuiltinCell(type, c["compute"], object) : EvalJsonPath(object, c.value("jsonPath", ""));
      if (c.value("type", "") == "date" && v.is_string())
        cells.push_back(HumanDuration(now - ParseRfc3339(v.get<std::string>())));
      else if (v.is_array()) {
        std::string joined;
        for (const auto& e : v) joined += (joined.empty() ? "" : ",") + (e.is_string() ? e.get<std::string>() : e.dump());
        cells.push_back(joined);
      } else {
        cells.push_back(v);
      }
    }
    json row_object;
    if (include_object) {
      row_object = object;
    } else {
      json meta = object["metadata"];
      meta.erase("managedFields");
      row_object = {{"kind", "PartialObjectMetadata"}, {"apiVersion", "meta.k8s.io/v1"}, {"metadata", meta}};
    }
    rows.push_back({{"cells", cells}, {"object", row_object}});
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", {{"resourceVersion", list_rv}}},
          {"columnDefinitions", columns},
          {"rows", rows}};
}

void FakeApiServer::HandleWatch(const Request& r, HttpResponseWriter& writer) {
  watch_requests_++;
  auto w = std::make_shared<Watcher>();
  w->resource = r.type->Qualified();
  w->ns = r.ns;
  w->label_selector = r.Query("labelSelector");
  w->field_selector = r.Query("fieldSelector");
  const std::string rv = r.Query("resourceVersion");
  const bool bookmarks = r.Query("allowWatchBookmarks") == "true";
  double timeout_s = 1800;
  if (!r.Query("timeoutSeconds").empty()) timeout_s = std::stod(r.Query("timeoutSeconds"));
  int drop_after = 0;
  bool cut = false;
  {
    std::lock_guard lock(mu_);
    ++watch_count_;
    drop_after = faults_.drop_watch_after_events;
    cut = watch_count_ % 2 == 0;
    const bool named_rv = !rv.empty() && rv != "0";
    bool gone = named_rv && faults_.gone_every_nth_watch > 0 && watch_count_ % faults_.gone_every_nth_watch == 0;
    int64_t since = 0;
    if (named_rv) {
      try {
        since = std::stoll(rv);
      } catch (...) {
        writer.Send(400, "application/json", StatusBody(400, "BadRequest", "invalid resource version: " + rv).dump());
        return;
      }
      if (since < compacted_rv_) gone = true;
    }
    if (gone) {
      std::string message = "too old resource version: " + rv + " (" + std::to_string(compacted_rv_ + 1) + ")";
      if (watch_count_ % 2 == 0) {
        // As the watch cache does: a 200 stream whose one event is an ERROR Status 410.
        writer.BeginStream(200, "application/json");
        writer.WriteChunk(json({{"type", "ERROR"}, {"object", StatusBody(410, "Expired", message)}}).dump() + "\n");
        writer.EndStream();
      } else {
        writer.Send(410, "application/json", StatusBody(410, "Expired", message).dump());
      }
      return;
    }
    if (!named_rv) {
      for (const auto& [key, object] : objects_[w->resource]) {
        if (!w->ns.empty() && object["metadata"].value("namespace", "") != w->ns) continue;
        if (!MatchesLabelSelector(object, w->label_selector) || !MatchesFieldSelector(object, w->field_selector))
          continue;
        w->events.push_back({{"type", "ADDED"}, {"object", object}});
      }
    } else {
      for (const auto& e : history_) {
        if (e.rv <= since || e.resource != w->resource) continue;
        if (!w->ns.empty() && e.object["metadata"].value("namespace", "") != w->ns) continue;
        if (!MatchesLabelSelector(e.object, w->label_selector) || !MatchesFieldSelector(e.object, w->field_selector))
          continue;
        w->events.push_back({{"type", e.type}, {"object", e.object}});
      }
    }
    watchers_.push_back(w);
  }
  auto unregister = [&] {
    std::lock_guard lock(mu_);
    watchers_.erase(std::remove(watchers_.begin(), watchers_.end(), w), watchers_.end());
  };
  if (!writer.BeginStream(200, "application/json")) return unregister();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto next_bookmark = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(options_.bookmark_interval_s * 1000));
  int sent = 0;
  bool peer_alive = true;
  // kubectl get -w asks for Tables: each event's object becomes a one-row
  // Table, the first one with the column definitions.
  const bool as_table = r.accept.find("as=Table") != std::string::npos;
  bool columns_sent = false;
  auto render = [&](json e) {
    if (as_table && e.value("type", "") != "BOOKMARK" && e.value("type", "") != "ERROR") {
      json table = ToTable(*r.type, {e["object"]}, e["object"]["metadata"].value("resourceVersion", ""),
                           r.Query("includeObject") == "Object");
      if (columns_sent) table["columnDefinitions"] = json::array();
      columns_sent = true;
      e["object"] = table;
    }
    return e.dump() + "\n";
  };
  while (peer_alive && !stopping_) {
    std::deque<json> batch;
    {
      std::unique_lock wl(w->mu);
      w->cv.wait_until(wl, std::min(deadline, next_bookmark), [&] { return !w->events.empty() || w->closed; });
      if (w->closed) break;
      batch.swap(w->events);
    }
    for (auto& e : batch) {
      if (!writer.WriteChunk(render(e))) {
        peer_alive = false;
        break;
      }
      if (drop_after > 0 && ++sent >= drop_after) {
        unregister();
        if (cut)
          writer.Abort();
        else
          writer.EndStream();
        return;
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    if (bookmarks && now >= next_bookmark) {
      next_bookmark = now + std::chrono::milliseconds(static_cast<int64_t>(options_.bookmark_interval_s * 1000));
      std::string bookmark;
      {
        std::lock_guard lock(mu_);
        std::lock_guard wl(w->mu);
        // Only when everything up to rv_ has been handed to this watcher.
        if (w->events.empty())
          bookmark = json({{"type", "BOOKMARK"},
                           {"object",
                            {{"kind", r.type->kind},
                             {"apiVersion", r.type->GroupVersion()},
                             {"metadata", {{"resourceVersion", std::to_string(rv_)}}}}}})
                         .dump() + "\n";
      }
      if (!bookmark.empty() && !writer.WriteChunk(bookmark)) peer_alive = false;
    }
  }
  unregister();
  if (peer_alive) writer.EndStream();
}

// ---------------------------------------------------------------------------
// Direct access for tests

Result<json> FakeApiServer::Get(const std::string& resource, const std::string& ns, const std::string& name) {
  std::lock_guard lock(mu_);
  const ResourceType* t = FindTypeByQualified(resource);
  if (!t) return Fail(Error::NotFound("no resource type " + resource));
  auto& store = objects_[resource];
  auto it = store.find(ns + "/" + name);
  if (it == store.end()) return Fail(Error::NotFound(resource + " " + ns + "/" + name));
  return it->second;
}

std::vector<json> FakeApiServer::List(const std::string& resource, const std::string& ns) {
  std::lock_guard lock(mu_);
  std::vector<json> out;
  for (const auto& [key, object] : objects_[resource])
    if (ns.empty() || object["metadata"].value("namespace", "") == ns) out.push_back(object);
  return out;
}

size_t FakeApiServer::Count(const std::string& resource, const std::string& ns,
                            const std::function<bool(const json&)>& pred) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, object] : objects_[resource])
    if ((ns.empty() || object["metadata"].value("namespace", "") == ns) && pred(object)) n++;
  return n;
}

Result<json> FakeApiServer::Create(const std::string& resource, const json& object) {
  std::lock_guard lock(mu_);
  Request r;
  r.method = "POST";
  r.type = FindTypeByQualified(resource);
  if (!r.type) return Fail(Error::NotFound("no resource type " + resource));
  r.ns = r.type->namespaced ? object["metadata"].value("namespace", "default") : "";
  r.user_agent = "test";
  Outcome o = DoCreate(r, object);
  if (o.code >= 300) return Fail(Error::InvalidArgument(o.body.value("message", "create failed")));
  return o.body;
}

Result<json> FakeApiServer::Mutate(const std::string& resource, const std::string& ns, const std::string& name,
                                   const std::function<void(json&)>& mutate, bool status) {
  std::lock_guard lock(mu_);
  Request r;
  r.method = "PUT";
  r.type = FindTypeByQualified(resource);
  if (!r.type) return Fail(Error::NotFound("no resource type " + resource));
  r.ns = ns;
  r.name = name;
  r.subresource = status ? "status" : "";
  r.user_agent = "test";
  auto& store = objects_[resource];
  auto it = store.find(ns + "/" + name);
  if (it == store.end()) return Fail(Error::NotFound(resource + " " + ns + "/" + name));
  json object = it->second;
  mutate(object);
  Outcome o = DoUpdate(r, object, false);
  if (o.code >= 300) return Fail(Error::InvalidArgument(o.body.value("message", "update failed")));
  return o.body;
}

Status FakeApiServer::Delete(const std::string& resource, const std::string& ns, const std::string& name) {
  std::lock_guard lock(mu_);
  Request r;
  r.method = "DELETE";
  r.type = FindTypeByQualified(resource);
  if (!r.type) return Fail(Error::NotFound("no resource type " + resource));
  r.ns = ns;
  r.name = name;
  Outcome o = DoDelete(r);
  if (o.code >= 300) return Fail(Error::InvalidArgument(o.body.value("message", "delete failed")));
  return Ok();
}

void FakeApiServer::SetPodLogReader(PodLogReader reader) {
  std::lock_guard lock(mu_);
  log_reader_ = std::move(reader);
}

void FakeApiServer::SetFaults(const FakeFaults& faults) {
  std::lock_guard lock(mu_);
  faults_ = faults;
}

void FakeApiServer::CompactHistory() {
  std::lock_guard lock(mu_);
  // Every resourceVersion handed out so far, the latest included, is now too old.
  compacted_rv_ = rv_ + 1;
  history_.clear();
}

std::vector<WriteRecord> FakeApiServer::Writes() const {
  std::lock_guard lock(mu_);
  return writes_;
}

std::vector<RequestRecord> FakeApiServer::Requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

int64_t FakeApiServer::CurrentResourceVersion() const {
  std::lock_guard lock(mu_);
  return rv_;
}

size_t FakeApiServer::ActiveWatches() const {
  std::lock_guard lock(mu_);
  return watchers_.size();
}

std::string FakeApiServer::LastBearerToken() const {
  std::lock_guard lock(mu_);
  return last_token_;
}

}  // namespace moeserve::fakes

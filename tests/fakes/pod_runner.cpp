#include "pod_runner.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/sha256.hpp"

namespace moeserve::fakes {

using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string NowRfc3339() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string Str(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}

json Obj(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_object() ? o[key] : json::object();
}
json Arr(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_array() ? o[key] : json::array();
}

bool LabelsMatch(const json& selector, const json& labels) {
  if (!selector.is_object() || selector.empty()) return false;
  for (const auto& [k, v] : selector.items())
    if (!labels.is_object() || !labels.contains(k) || labels[k] != v) return false;
  return true;
}

// The StatefulSet that controls a pod, if any.
std::string ControllingStatefulSet(const json& pod) {
  for (const auto& ref : Arr(pod["metadata"], "ownerReferences"))
    if (ref.value("kind", "") == "StatefulSet" && ref.value("controller", false)) return ref.value("uid", "");
  return "";
}

bool WriteFileIfChanged(const fs::path& path, const std::string& content, fs::perms mode) {
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str() == content) return false;
    }
  }
  fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
  }
  fs::permissions(tmp, mode);
  fs::rename(tmp, path);
  return true;
}

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

int Connect(int port, int timeout_ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof err;
  if (::poll(&p, 1, timeout_ms) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

// An HTTP GET as the kubelet's probe makes it: 200-399 passes; HTTPS is not verified.
bool HttpProbe(int port, const std::string& path, bool https, int timeout_ms) {
  int fd = Connect(port, timeout_ms);
  if (fd < 0) return false;
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                              "\r\nUser-Agent: kube-probe/pod-runner\r\nConnection: close\r\n\r\n";
  std::string response;
  char buf[512];
  if (https) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL* ssl = ctx ? SSL_new(ctx) : nullptr;
    if (ssl && SSL_set_fd(ssl, fd) == 1 && SSL_connect(ssl) == 1 &&
        SSL_write(ssl, request.data(), static_cast<int>(request.size())) > 0) {
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) response.assign(buf, n);
    }
    if (ssl) SSL_free(ssl);
    if (ctx) SSL_CTX_free(ctx);
  } else if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) response.assign(buf, n);
  }
  ::close(fd);
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return false;
  const int code = std::atoi(response.substr(9, 3).c_str());
  return code >= 200 && code < 400;
}

// $(VAR) references of Kubernetes env values, args and commands; $$ escapes.
std::string Expand(const std::string& s, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '$') {
      out += '$';
      ++i;
    } else if (s[i] == '$' && i + 1 < s.size() && s[i + 1] == '(') {
      const size_t close = s.find(')', i + 2);
      if (close == std::string::npos) {
        out += s.substr(i);
        break;
      }
      const std::string name = s.substr(i + 2, close - i - 2);
      auto it = vars.find(name);
      out += it == vars.end() ? s.substr(i, close - i + 1) : it->second;
      i = close;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool PathChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '.' || c == '_' || c == '-'; }

}  // namespace

// One container's process and what the kubelet reports of it.
struct Container {
  json spec;
  bool init = false;
  pid_t pid = -1;
  int restarts = 0;
  Clock::time_point next_start{};
  std::chrono::seconds backoff{0};
  json state = {{"waiting", {{"reason", "PodInitializing"}}}};
  json last_state = json::object();
  bool started = false, ready = false, done = false;  // done: an init container that exited 0
  int ready_successes = 0, ready_failures = 0, live_failures = 0;
  Clock::time_point next_ready_probe{}, next_live_probe{}, started_at{};
};

struct PodRunner::Pod {
  std::string ns, name, uid;
  json object;  // as last listed
  fs::path dir, rootfs;
  std::vector<Container> inits, mains;
  std::vector<std::string> mount_paths;  // sorted longest first
  std::string refused;                  // why the runner will not run it
  std::string refused_reason;           // ErrImagePull, CreateContainerConfigError, Unschedulable
  bool scheduled = false, prepared = false, terminating = false;
  std::string waiting_reason, waiting_message;  // before containers can start
  Clock::time_point kill_at{}, next_refresh{};
  std::string start_time;
  json last_status;
  std::set<std::string> events_sent;
};

namespace {

std::string Remap(const std::string& s, const PodRunner::Pod& pod) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    bool matched = false;
    if (s[i] == '/' && (i == 0 || !PathChar(s[i - 1]))) {
      for (const auto& m : pod.mount_paths) {
        if (s.compare(i, m.size(), m) != 0) continue;
        const size_t end = i + m.size();
        if (end < s.size() && s[end] != '/' && PathChar(s[end])) continue;
        out += pod.rootfs.string() + m;
        i = end;
        matched = true;
        break;
      }
    }
    if (!matched) out += s[i++];
  }
  return out;
}

std::string ContainerName(const Container& c) { return c.spec.value("name", ""); }

void Event(FakeApiServer& server, PodRunner::Pod& pod, const std::string& type, const std::string& reason,
           const std::string& message) {
  if (!pod.events_sent.insert(reason + ":" + message).second) return;
  std::cerr << "pod-runner: " << pod.ns << "/" << pod.name << ": " << reason << ": " << message << std::endl;
  static std::atomic<int> counter{0};
  json ev = {{"apiVersion", "v1"},
             {"kind", "Event"},
             {"metadata", {{"name", pod.name + "." + std::to_string(++counter)}, {"namespace", pod.ns}}},
             {"involvedObject",
              {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", pod.name}, {"namespace", pod.ns}, {"uid", pod.uid}}},
             {"reason", reason},
             {"message", message},
             {"type", type},
             {"source", {{"component", reason == "FailedScheduling" || reason == "Scheduled" ? "default-scheduler" : "kubelet"}}},
             {"firstTimestamp", NowRfc3339()},
             {"lastTimestamp", NowRfc3339()},
             {"count", 1}};
  (void)server.Create("events", ev);
}

void KillGroup(pid_t pid, int sig) {
  if (pid > 0) ::kill(-pid, sig);
}

}  // namespace

PodRunner::PodRunner(FakeApiServer& server, PodRunnerOptions options) : server_(server), options_(std::move(options)) {}

PodRunner::~PodRunner() { Stop(); }

std::string PodRunner::PodRootfs(const std::string& ns, const std::string& name) const {
  return (fs::path(options_.root) / "pods" / ns / name / "rootfs").string();
}

Status PodRunner::Start() {
  if (options_.root.empty() || options_.root[0] != '/')
    return Fail(Error::InvalidArgument("the pod runner's root must be an absolute path, not \"" + options_.root + "\""));
  std::error_code ec;
  fs::create_directories(options_.root, ec);
  if (ec) return Fail(Error::Io(options_.root + ": " + ec.message()));
  for (const auto& [image, exe] : options_.images)
    if (::access(exe.c_str(), X_OK) != 0)
      return Fail(Error::InvalidArgument("image " + image + " maps to " + exe + ", which is not an executable"));
  server_.SetPodLogReader([this](const std::string& ns, const std::string& pod, const std::string& container,
                                 bool previous) { return ReadLog(ns, pod, container, previous); });
  thread_ = std::thread([this] { Loop(); });
  return Ok();
}

void PodRunner::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  server_.SetPodLogReader(nullptr);
  std::lock_guard lock(mu_);
  // Every container: SIGTERM, then SIGKILL for what is left after the grace period.
  std::vector<pid_t> pids;
  for (auto& [uid, pod] : pods_)
    for (auto* list : {&pod->inits, &pod->mains})
      for (auto& c : *list)
        if (c.pid > 0) {
          KillGroup(c.pid, SIGTERM);
          pids.push_back(c.pid);
        }
  const auto deadline = Clock::now() + std::chrono::seconds(options_.max_grace_seconds);
  for (pid_t pid : pids) {
    while (::waitpid(pid, nullptr, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        KillGroup(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  pods_.clear();
}

void PodRunner::Loop() {
  while (!stopping_) {
    Tick();
    const auto until = Clock::now() + options_.tick;
    while (!stopping_ && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void PodRunner::Tick() {
  ReconcileStatefulSets();
  SyncPods();
  SyncEndpoints();
}

// ---------------------------------------------------------------------------
// The StatefulSet controller

void PodRunner::ReconcileStatefulSets() {
  const auto pods = server_.List("pods");
  for (const auto& sts : server_.List("statefulsets.apps")) {
    const json meta = sts["metadata"];
    if (meta.contains("deletionTimestamp")) continue;
    const std::string ns = Str(meta, "namespace"), name = Str(meta, "name"), uid = Str(meta, "uid");
    const json spec = Obj(sts, "spec");
    const int want = spec.value("replicas", 1);
    const json tmpl = Obj(spec, "template");
    const std::string revision = name + "-" + Sha256Hex(tmpl.dump()).substr(0, 10);
    std::map<int, json> owned;
    for (const auto& pod : pods)
      if (Str(pod["metadata"], "namespace") == ns && ControllingStatefulSet(pod) == uid) {
        const std::string pod_name = Str(pod["metadata"], "name");
        const std::string prefix = name + "-";
        if (pod_name.rfind(prefix, 0) != 0) continue;
        try {
          owned[std::stoi(pod_name.substr(prefix.size()))] = pod;
        } catch (...) {
        }
      }
    for (int i = 0; i < want; ++i) {
      if (owned.contains(i)) continue;
      json pod_meta = Obj(tmpl, "metadata");
      const std::string pod_name = name + "-" + std::to_string(i);
      pod_meta["name"] = pod_name;
      pod_meta["namespace"] = ns;
      pod_meta["labels"]["apps.kubernetes.io/pod-index"] = std::to_string(i);
      pod_meta["labels"]["statefulset.kubernetes.io/pod-name"] = pod_name;
      pod_meta["labels"]["controller-revision-hash"] = revision;
      pod_meta["ownerReferences"] = json::array({{{"apiVersion", "apps/v1"},
                                                  {"kind", "StatefulSet"},
                                                  {"name", name},
                                                  {"uid", uid},
                                                  {"controller", true},
                                                  {"blockOwnerDeletion", true}}});
      json pod_spec = Obj(tmpl, "spec");
      pod_spec["hostname"] = pod_name;
      if (!Str(spec, "serviceName").empty()) pod_spec["subdomain"] = Str(spec, "serviceName");
      for (const auto& claim : Arr(spec, "volumeClaimTemplates")) {
        const std::string claim_name = Str(claim["metadata"], "name");
        pod_spec["volumes"].push_back(
            {{"name", claim_name}, {"persistentVolumeClaim", {{"claimName", claim_name + "-" + pod_name}}}});
      }
      json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", pod_meta}, {"spec", pod_spec}};
      if (auto created = server_.Create("pods", pod)) owned[i] = *created;
    }
    int ready = 0, updated = 0, replicas = 0;
    std::string current_revision = revision;
    for (auto& [i, pod] : owned) {
      if (i >= want) {
        (void)server_.Delete("pods", ns, Str(pod["metadata"], "name"));
        continue;
      }
      ++replicas;
      const std::string pod_revision = Str(Obj(pod["metadata"], "labels"), "controller-revision-hash");
      if (pod_revision == revision) ++updated;
      else current_revision = pod_revision;
      for (const auto& c : Arr(Obj(pod, "status"), "conditions"))
        if (c.value("type", "") == "Ready" && c.value("status", "") == "True") ++ready;
    }
    json status = {{"observedGeneration", meta.value("generation", int64_t{1})},
                   {"replicas", replicas},
                   {"readyReplicas", ready},
                   {"availableReplicas", ready},
                   {"currentReplicas", updated == replicas ? replicas : replicas - updated},
                   {"updatedReplicas", updated},
                   {"currentRevision", current_revision},
                   {"updateRevision", revision}};
    if (Obj(sts, "status") != status)
      (void)server_.Mutate("statefulsets.apps", ns, name, [&](json& o) { o["status"] = status; }, true);
  }
}

// ---------------------------------------------------------------------------
// The scheduler and the kubelet

namespace {

std::string ExecutableFor(const std::string& image, const PodRunnerOptions& options) {
  auto it = options.images.find(image);
  if (it != options.images.end()) return it->second;
  std::string repo = image;
  if (auto at = repo.find('@'); at != std::string::npos) repo = repo.substr(0, at);
  const auto slash = repo.rfind('/');
  if (auto colon = repo.rfind(':'); colon != std::string::npos && (slash == std::string::npos || colon > slash))
    repo = repo.substr(0, colon);
  it = options.images.find(repo);
  return it == options.images.end() ? "" : it->second;
}

// What the runner refuses in a pod spec, and why ("" when it can run it).
std::pair<std::string, std::string> Refusal(const json& spec, const PodRunnerOptions& options) {
  const json node_selector = Obj(spec, "nodeSelector");  // items() refers to it: not a temporary
  for (const auto& [key, value] : node_selector.items()) {
    auto it = options.node_labels.find(key);
    if (it == options.node_labels.end() || !value.is_string() || it->second != value.get<std::string>())
      return {"Unschedulable", "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector (" + key +
                                   "=" + (value.is_string() ? value.get<std::string>() : value.dump()) +
                                   "; the pod runner's node has no such label)"};
  }
  for (const char* list : {"initContainers", "containers"})
    for (const auto& c : Arr(spec, list))
      for (const char* side : {"requests", "limits"})
        for (const json amounts = Obj(Obj(c, "resources"), side); const auto& [resource, quantity] : amounts.items())
          if (resource != "cpu" && resource != "memory" && resource != "ephemeral-storage" &&
              !(quantity.is_string() && quantity.get<std::string>() == "0"))
            return {"Unschedulable", "0/1 nodes are available: 1 Insufficient " + resource +
                                         " (the pod runner's node has none)"};
  if (spec.value("hostPID", false) || spec.value("hostIPC", false))
    return {"CreateContainerConfigError", "hostPID and hostIPC are not honoured by the pod runner"};
  for (const auto& v : Arr(spec, "volumes")) {
    if (v.contains("hostPath"))
      return {"CreateContainerConfigError", "volume \"" + Str(v, "name") + "\": hostPath volumes are not honoured by "
                                            "the pod runner (it never writes outside its root)"};
    if (!v.contains("configMap") && !v.contains("secret") && !v.contains("emptyDir") && !v.contains("persistentVolumeClaim"))
      return {"CreateContainerConfigError", "volume \"" + Str(v, "name") + "\": only configMap, secret, emptyDir and "
                                            "persistentVolumeClaim volumes are honoured by the pod runner"};
  }
  for (const char* list : {"initContainers", "containers"})
    for (const auto& c : Arr(spec, list)) {
      const std::string who = "container \"" + Str(c, "name") + "\": ";
      const json sc = Obj(c, "securityContext");
      if (sc.value("privileged", false)) return {"CreateContainerConfigError", who + "privileged containers are not honoured by the pod runner"};
      if (!Arr(Obj(sc, "capabilities"), "add").empty())
        return {"CreateContainerConfigError", who + "added capabilities are not honoured by the pod runner"};
      if (c.contains("lifecycle")) return {"CreateContainerConfigError", who + "lifecycle hooks are not run by the pod runner"};
      if (std::string(list) == "initContainers" && c.contains("restartPolicy"))
        return {"CreateContainerConfigError", who + "sidecar init containers are not run by the pod runner"};
      for (const char* probe : {"readinessProbe", "livenessProbe", "startupProbe"})
        if (c.contains(probe) && c[probe].contains("grpc"))
          return {"CreateContainerConfigError", who + "gRPC probes are not run by the pod runner"};
      const std::string image = Str(c, "image");
      const std::string exe = ExecutableFor(image, options);
      if (exe.empty())
        return {"ErrImagePull", who + "the pod runner maps no local executable to image \"" + image +
                                    "\" (moe-fake-apiserver --image IMAGE=PATH)"};
      if (c.contains("command")) {
        const json cmd = Arr(c, "command");
        if (cmd.empty() || !cmd[0].is_string() ||
            fs::path(cmd[0].get<std::string>()).filename() != fs::path(exe).filename())
          return {"CreateContainerConfigError", who + "command " + cmd.dump() + " names another program than " +
                                                    exe + ", the executable of image " + image};
      }
    }
  // Mount paths must not nest: each is a link to its volume's folder.
  std::vector<std::string> paths;
  for (const char* list : {"initContainers", "containers"})
    for (const auto& c : Arr(spec, list))
      for (const auto& m : Arr(c, "volumeMounts")) paths.push_back(Str(m, "mountPath"));
  for (const auto& a : paths)
    for (const auto& b : paths)
      if (a != b && b.rfind(a + "/", 0) == 0)
        return {"CreateContainerConfigError", "mount path " + b + " lies inside mount path " + a +
                                                  ", which the pod runner cannot honour"};
  return {};
}

// A port by number or by the container's port name.
int ResolvePort(const json& port, const json& container) {
  if (port.is_number_integer()) return port.get<int>();
  if (port.is_string()) {
    for (const auto& p : Arr(container, "ports"))
      if (Str(p, "name") == port.get<std::string>()) return p.value("containerPort", 0);
    try {
      return std::stoi(port.get<std::string>());
    } catch (...) {
    }
  }
  return 0;
}

}  // namespace

namespace {

// Projects the pod's volumes into its folder and links its mount paths; a
// message when something it needs does not exist yet.
std::string Prepare(FakeApiServer& server, PodRunner::Pod& pod, const std::string& root, bool refresh_only) {
  const json spec = pod.object["spec"];
  for (const auto& v : Arr(spec, "volumes")) {
    const std::string name = Str(v, "name");
    const fs::path dir = pod.dir / "volumes" / name;
    if (v.contains("emptyDir")) {
      fs::create_directories(dir);
    } else if (v.contains("persistentVolumeClaim")) {
      fs::create_directories(fs::path(root) / "claims" / pod.ns / Str(v["persistentVolumeClaim"], "claimName"));
    } else {
      const bool is_secret = v.contains("secret");
      const json src = is_secret ? v["secret"] : v["configMap"];
      const std::string object_name = is_secret ? Str(src, "secretName") : Str(src, "name");
      auto object = server.Get(is_secret ? "secrets" : "configmaps", pod.ns, object_name);
      fs::create_directories(dir);
      if (!object) {
        if (src.value("optional", false)) continue;
        return std::string(is_secret ? "secret" : "configmap") + " \"" + object_name + "\" not found";
      }
      std::map<std::string, std::string> files;  // key -> content
      const json data = Obj(*object, "data"), binary = Obj(*object, "binaryData");
      for (const auto& [k, val] : data.items())
        if (val.is_string()) files[k] = is_secret ? Base64Decode(val.get<std::string>()) : Remap(val.get<std::string>(), pod);
      if (!is_secret)
        for (const auto& [k, val] : binary.items())
          if (val.is_string()) files[k] = Base64Decode(val.get<std::string>());
      const int mode = src.value("defaultMode", 0644);
      std::map<std::string, std::string> paths;  // path in the volume -> key
      if (src.contains("items")) {
        for (const auto& item : Arr(src, "items")) {
          if (!files.contains(Str(item, "key"))) {
            if (src.value("optional", false)) continue;
            return std::string(is_secret ? "secret" : "configmap") + " \"" + object_name + "\" has no key \"" +
                   Str(item, "key") + "\"";
          }
          paths[Str(item, "path")] = Str(item, "key");
        }
      } else {
        for (const auto& [k, content] : files) paths[k] = k;
      }
      for (const auto& [path, key] : paths) {
        const fs::path target = (dir / path).lexically_normal();
        if (target.string().rfind(dir.string(), 0) != 0) return "volume \"" + name + "\": path \"" + path + "\" leaves the volume";
        // Readable by the runner's user whatever the mode says: the
        // processes run as that user, not as runAsUser.
        WriteFileIfChanged(target, files[key], static_cast<fs::perms>(mode | 0400));
      }
    }
  }
  if (refresh_only) return "";
  for (const char* list : {"initContainers", "containers"})
    for (const auto& c : Arr(spec, list))
      for (const auto& m : Arr(c, "volumeMounts")) {
        const std::string volume = Str(m, "name");
        json v;
        for (const auto& candidate : Arr(spec, "volumes"))
          if (Str(candidate, "name") == volume) v = candidate;
        if (v.is_null()) return "volume \"" + volume + "\" of container \"" + Str(c, "name") + "\" is not in the pod";
        fs::path source = v.contains("persistentVolumeClaim")
                              ? fs::path(root) / "claims" / pod.ns / Str(v["persistentVolumeClaim"], "claimName")
                              : pod.dir / "volumes" / volume;
        if (!Str(m, "subPath").empty()) {
          source /= Str(m, "subPath");
          if (source.lexically_normal().string().rfind(pod.dir.string(), 0) != 0 &&
              source.lexically_normal().string().rfind(root, 0) != 0)
            return "subPath " + Str(m, "subPath") + " leaves its volume";
        }
        const fs::path link = pod.rootfs / fs::path(Str(m, "mountPath")).relative_path();
        if (fs::is_symlink(link)) continue;
        fs::create_directories(link.parent_path());
        fs::create_directories(source);
        fs::create_directory_symlink(source, link);
      }
  return "";
}

}  // namespace

void PodRunner::SyncPods() {
  const auto listed = server_.List("pods");
  std::set<std::string> seen;
  std::map<int, std::string> ports_held;  // port -> pod, among running containers
  std::lock_guard lock(mu_);
  for (const auto& [uid, pod] : pods_)
    for (const auto& c : pod->mains)
      if (c.pid > 0)
        for (const auto& p : Arr(c.spec, "ports")) ports_held[p.value("containerPort", 0)] = pod->ns + "/" + pod->name;

  for (const auto& object : listed) {
    if (ControllingStatefulSet(object).empty()) continue;  // only pods of StatefulSets
    const std::string uid = Str(object["metadata"], "uid");
    if (object["metadata"].contains("deletionTimestamp")) continue;
    seen.insert(uid);
    auto& slot = pods_[uid];
    if (!slot) {
      slot = std::make_unique<Pod>();
      slot->ns = Str(object["metadata"], "namespace");
      slot->name = Str(object["metadata"], "name");
      slot->uid = uid;
      slot->dir = fs::path(options_.root) / "pods" / slot->ns / slot->name;
      fs::remove_all(slot->dir);  // a pod of the same name before this one
      slot->rootfs = slot->dir / "rootfs";
      fs::create_directories(slot->rootfs);
      slot->start_time = NowRfc3339();
      for (const auto& c : Arr(object["spec"], "initContainers")) slot->inits.push_back({.spec = c, .init = true});
      for (const auto& c : Arr(object["spec"], "containers")) slot->mains.push_back({.spec = c});
      for (const char* list : {"initContainers", "containers"})
        for (const auto& c : Arr(object["spec"], list))
          for (const auto& m : Arr(c, "volumeMounts")) slot->mount_paths.push_back(Str(m, "mountPath"));
      std::sort(slot->mount_paths.begin(), slot->mount_paths.end(),
                [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
      slot->mount_paths.erase(std::unique(slot->mount_paths.begin(), slot->mount_paths.end()), slot->mount_paths.end());
      auto [reason, message] = Refusal(object["spec"], options_);
      slot->refused_reason = reason;
      slot->refused = message;
      if (!reason.empty())
        Event(server_, *slot, "Warning", reason == "Unschedulable" ? "FailedScheduling" : "Failed", message);
      else
        Event(server_, *slot, "Normal", "Scheduled", "Successfully assigned " + slot->ns + "/" + slot->name + " to local");
    }
    slot->object = object;
  }

  const auto now = Clock::now();
  for (auto it = pods_.begin(); it != pods_.end();) {
    Pod& pod = *it->second;
    // Deleted: stop its containers, SIGKILL after the grace period.
    if (!seen.contains(pod.uid)) {
      if (!pod.terminating) {
        pod.terminating = true;
        const int grace = std::min<int>(options_.max_grace_seconds,
                                        pod.object["spec"].value("terminationGracePeriodSeconds", 30));
        pod.kill_at = now + std::chrono::seconds(grace);
        for (auto* list : {&pod.inits, &pod.mains})
          for (auto& c : *list) KillGroup(c.pid, SIGTERM);
      }
      bool alive = false;
      for (auto* list : {&pod.inits, &pod.mains})
        for (auto& c : *list) {
          if (c.pid <= 0) continue;
          if (::waitpid(c.pid, nullptr, WNOHANG) == c.pid) c.pid = -1;
          else if (now >= pod.kill_at) KillGroup(c.pid, SIGKILL);
          if (c.pid > 0) alive = true;
        }
      if (!alive) it = pods_.erase(it);
      else ++it;
      continue;
    }
    ++it;
    if (!pod.refused.empty()) continue;  // its status is written below, once

    // Volumes (re-projected every 2 s: rotated keys, renewed certificates).
    if (!pod.prepared || now >= pod.next_refresh) {
      std::string missing;
      try {
        missing = Prepare(server_, pod, options_.root, pod.prepared);
      } catch (const std::exception& e) {
        missing = e.what();
      }
      pod.next_refresh = now + std::chrono::seconds(2);
      if (!pod.prepared) {
        if (!missing.empty()) {
          pod.waiting_reason = "ContainerCreating";
          pod.waiting_message = "MountVolume.SetUp failed: " + missing;
          continue;
        }
        pod.prepared = true;
        pod.waiting_reason.clear();
        pod.waiting_message.clear();
      }
    }

    // Environment common to the pod's containers.
    auto start = [&](Container& c) -> std::string {
      const json& cs = c.spec;
      std::map<std::string, std::string> vars;
      std::vector<std::pair<std::string, std::string>> env = {
          {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
          {"HOSTNAME", pod.name},
          {"KUBERNETES_SERVICE_HOST", "127.0.0.1"},
          {"KUBERNETES_SERVICE_PORT", server_.url().substr(server_.url().rfind(':') + 1)},
      };
      for (const auto& e : Arr(cs, "env")) {
        const std::string name = Str(e, "name");
        std::string value;
        if (e.contains("value")) {
          value = Remap(Expand(Str(e, "value"), vars), pod);
        } else if (e.contains("valueFrom")) {
          const json from = e["valueFrom"];
          if (from.contains("fieldRef")) {
            const std::string path = Str(from["fieldRef"], "fieldPath");
            static const std::regex keyed(R"(metadata\.(labels|annotations)\['([^']+)'\])");
            std::smatch m;
            if (path == "metadata.name") value = pod.name;
            else if (path == "metadata.namespace") value = pod.ns;
            else if (path == "metadata.uid") value = pod.uid;
            else if (path == "status.podIP" || path == "status.hostIP") value = "127.0.0.1";
            else if (path == "spec.nodeName") value = "local";
            else if (path == "spec.serviceAccountName") value = Str(pod.object["spec"], "serviceAccountName");
            else if (std::regex_match(path, m, keyed)) value = Str(Obj(pod.object["metadata"], m[1].str().c_str()), m[2].str().c_str());
            else return "fieldRef " + path + " is not resolved by the pod runner";
          } else if (from.contains("secretKeyRef") || from.contains("configMapKeyRef")) {
            const bool secret = from.contains("secretKeyRef");
            const json ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
            auto object = server_.Get(secret ? "secrets" : "configmaps", pod.ns, Str(ref, "name"));
            const json data = object ? Obj(*object, "data") : json::object();
            if (!data.contains(Str(ref, "key"))) {
              if (ref.value("optional", false)) continue;
              return std::string(secret ? "secret" : "configmap") + " \"" + Str(ref, "name") + "\" has no key \"" +
                     Str(ref, "key") + "\"";
            }
            value = data[Str(ref, "key")].get<std::string>();
            if (secret) value = Base64Decode(value);
          } else {
            return "env " + name + ": only fieldRef, secretKeyRef and configMapKeyRef are resolved by the pod runner";
          }
        }
        vars[name] = value;
        env.emplace_back(name, value);
      }
      const std::string exe = ExecutableFor(Str(cs, "image"), options_);
      std::vector<std::string> argv = {exe};
      const json command = Arr(cs, "command");
      for (size_t i = 1; i < command.size(); ++i)  // [0] is the program: the image's executable
        argv.push_back(Remap(Expand(command[i].get<std::string>(), vars), pod));
      for (const auto& a : Arr(cs, "args")) argv.push_back(Remap(Expand(a.get<std::string>(), vars), pod));
      const std::string cwd = Str(cs, "workingDir").empty() ? pod.rootfs.string() : Remap(Str(cs, "workingDir"), pod);
      fs::create_directories(pod.dir / "logs");
      const fs::path log = pod.dir / "logs" / (ContainerName(c) + ".log");
      if (fs::exists(log)) fs::rename(log, pod.dir / "logs" / (ContainerName(c) + ".previous.log"));
      std::vector<std::string> env_strings;
      for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
      std::vector<char*> cargv, cenv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      for (auto& e : env_strings) cenv.push_back(e.data());
      cenv.push_back(nullptr);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) return "cannot open " + log.string();
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::setpgid(0, 0);
        // The runner gone (a crash included), its containers get SIGTERM: none outlives it.
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        const int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        if (::chdir(cwd.c_str()) != 0) _exit(126);
        ::execve(cargv[0], cargv.data(), cenv.data());
        _exit(127);
      }
      ::close(fd);
      if (pid < 0) return "fork failed";
      c.pid = pid;
      c.started_at = Clock::now();
      c.state = {{"running", {{"startedAt", NowRfc3339()}}}};
      c.ready = false;
      c.ready_successes = c.ready_failures = c.live_failures = 0;
      const json rp = Obj(cs, "readinessProbe"), lp = Obj(cs, "livenessProbe");
      c.next_ready_probe = c.started_at + std::chrono::seconds(rp.value("initialDelaySeconds", 0));
      c.next_live_probe = c.started_at + std::chrono::seconds(lp.value("initialDelaySeconds", 0));
      Event(server_, pod, "Normal", "Started", "Started container " + ContainerName(c) + " (" + exe + ", pid " +
                                                   std::to_string(pid) + ")");
      return "";
    };

    // Reaps an exited container: terminated state, back-off before the next start.
    auto reap = [&](Container& c) {
      if (c.pid <= 0) return;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) return;
      c.pid = -1;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      json terminated = {{"exitCode", code},
                         {"reason", code == 0 ? "Completed" : "Error"},
                         {"startedAt", c.state.contains("running") ? c.state["running"].value("startedAt", "") : ""},
                         {"finishedAt", NowRfc3339()}};
      if (!WIFEXITED(status)) terminated["signal"] = WTERMSIG(status);
      c.ready = false;
      if (c.init && code == 0) {
        c.done = true;
        c.state = {{"terminated", terminated}};
        return;
      }
      c.last_state = {{"terminated", terminated}};
      c.state = {{"terminated", terminated}};
      ++c.restarts;
      c.backoff = c.backoff.count() == 0 ? std::chrono::seconds(1) : std::min(c.backoff * 2, std::chrono::seconds(10));
      c.next_start = Clock::now() + c.backoff;
      Event(server_, pod, "Warning", "BackOff", "Back-off restarting failed container " + ContainerName(c) +
                                                    " (exit code " + std::to_string(code) + ", restart " +
                                                    std::to_string(c.restarts) + ")");
    };

    // Runs a probe; true when it passes.
    auto probe = [&](const Container& c, const json& p) -> bool {
      const int timeout_ms = 1000 * p.value("timeoutSeconds", 1);
      if (p.contains("httpGet")) {
        const json h = p["httpGet"];
        return HttpProbe(ResolvePort(h.value("port", json()), c.spec), Str(h, "path").empty() ? "/" : Str(h, "path"),
                         Str(h, "scheme") == "HTTPS", timeout_ms);
      }
      if (p.contains("tcpSocket")) {
        int fd = Connect(ResolvePort(p["tcpSocket"].value("port", json()), c.spec), timeout_ms);
        if (fd >= 0) ::close(fd);
        return fd >= 0;
      }
      if (p.contains("exec")) {
        std::vector<std::string> argv;
        for (const auto& a : Arr(p["exec"], "command")) argv.push_back(Remap(a.get<std::string>(), pod));
        if (argv.empty()) return false;
        std::vector<char*> cargv;
        for (auto& a : argv) cargv.push_back(a.data());
        cargv.push_back(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
          if (::chdir(pod.rootfs.c_str()) != 0) _exit(126);
          ::execvp(cargv[0], cargv.data());
          _exit(127);
        }
        int status = 0;
        return pid > 0 && ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      return true;
    };

    // Init containers, in order.
    bool initialized = true;
    for (auto& c : pod.inits) {
      if (c.done) continue;
      initialized = false;
      reap(c);
      if (c.done) {
        initialized = true;
        continue;
      }
      if (c.pid < 0 && now >= c.next_start) {
        if (auto why = start(c); !why.empty()) {
          c.state = {{"waiting", {{"reason", "CreateContainerConfigError"}, {"message", why}}}};
        }
      } else if (c.pid < 0 && c.restarts > 1) {
        c.state = {{"waiting", {{"reason", "CrashLoopBackOff"},
                                {"message", "back-off " + std::to_string(c.backoff.count()) + "s restarting failed container"}}}};
      }
      break;
    }
    if (initialized) {
      for (auto& c : pod.mains) {
        reap(c);
        if (c.pid < 0 && now >= c.next_start) {
          // The pod shares the machine's network: its ports must be free.
          std::string taken;
          for (const auto& p : Arr(c.spec, "ports")) {
            const int port = p.value("containerPort", 0);
            auto holder = ports_held.find(port);
            if (holder != ports_held.end() && holder->second != pod.ns + "/" + pod.name)
              taken = "port " + std::to_string(port) + " is held by pod " + holder->second;
            else if (!PortFree(port))
              taken = "port " + std::to_string(port) + " is in use on this machine";
          }
          if (!taken.empty()) {
            c.state = {{"waiting", {{"reason", "PortInUse"},
                                    {"message", taken + " (the pod runner's pods share the machine's network)"}}}};
            Event(server_, pod, "Warning", "PortInUse", taken);
            continue;
          }
          if (auto why = start(c); !why.empty())
            c.state = {{"waiting", {{"reason", "CreateContainerConfigError"}, {"message", why}}}};
          else
            for (const auto& p : Arr(c.spec, "ports")) ports_held[p.value("containerPort", 0)] = pod.ns + "/" + pod.name;
        } else if (c.pid < 0 && c.restarts > 1) {
          c.state = {{"waiting", {{"reason", "CrashLoopBackOff"},
                                  {"message", "back-off " + std::to_string(c.backoff.count()) + "s restarting failed container"}}}};
        }
        if (c.pid <= 0) continue;
        c.started = true;
        // Readiness: until the first success every half second (the
        // kubelet waits periodSeconds; locally there is no reason to), then periodSeconds.
        const json rp = Obj(c.spec, "readinessProbe");
        if (rp.empty()) {
          c.ready = true;
        } else if (now >= c.next_ready_probe) {
          const bool ok = probe(c, rp);
          c.ready_successes = ok ? c.ready_successes + 1 : 0;
          c.ready_failures = ok ? 0 : c.ready_failures + 1;
          if (ok && c.ready_successes >= rp.value("successThreshold", 1)) c.ready = true;
          if (!ok && c.ready_failures >= rp.value("failureThreshold", 3)) c.ready = false;
          c.next_ready_probe = Clock::now() + (c.ready ? std::chrono::milliseconds(1000 * rp.value("periodSeconds", 10))
                                                       : std::chrono::milliseconds(500));
        }
        const json lp = Obj(c.spec, "livenessProbe");
        if (!lp.empty() && now >= c.next_live_probe) {
          const bool ok = probe(c, lp);
          c.live_failures = ok ? 0 : c.live_failures + 1;
          c.next_live_probe = Clock::now() + std::chrono::seconds(lp.value("periodSeconds", 10));
          if (c.live_failures >= lp.value("failureThreshold", 3)) {
            Event(server_, pod, "Warning", "Unhealthy", "Liveness probe failed " + std::to_string(c.live_failures) +
                                                           " times: container " + ContainerName(c) + " will be restarted");
            KillGroup(c.pid, SIGKILL);
            c.live_failures = 0;
          }
        }
      }
    }
  }

  // Status, written when it changed.
  for (auto& [uid, pod_ptr] : pods_) {
    Pod& pod = *pod_ptr;
    if (pod.terminating) continue;
    json status = json::object();
    auto condition = [](const char* type, bool ok, const std::string& reason = "", const std::string& message = "") {
      json c = {{"type", type}, {"status", ok ? "True" : "False"}};
      if (!reason.empty()) c["reason"] = reason;
      if (!message.empty()) c["message"] = message;
      return c;
    };
    auto container_status = [&](const Container& c) {
      json s = {{"name", ContainerName(c)},
                {"image", Str(c.spec, "image")},
                {"imageID", ""},
                {"ready", c.ready},
                {"started", c.pid > 0},
                {"restartCount", c.restarts},
                {"state", c.state},
                {"lastState", c.last_state}};
      if (!pod.refused.empty() && pod.refused_reason != "Unschedulable")
        s["state"] = {{"waiting", {{"reason", pod.refused_reason}, {"message", pod.refused}}}};
      else if (!pod.waiting_reason.empty())
        s["state"] = {{"waiting", {{"reason", pod.waiting_reason}, {"message", pod.waiting_message}}}};
      return s;
    };
    if (pod.refused_reason == "Unschedulable") {
      status = {{"phase", "Pending"},
                {"conditions", json::array({condition("PodScheduled", false, "Unschedulable", pod.refused)})}};
    } else {
      bool initialized = true;
      for (const auto& c : pod.inits) initialized = initialized && c.done;
      bool all_ready = !pod.mains.empty() && pod.refused.empty();
      bool running = false;
      for (const auto& c : pod.mains) {
        all_ready = all_ready && c.ready;
        running = running || c.pid > 0;
      }
      json inits = json::array(), mains = json::array();
      for (const auto& c : pod.inits) inits.push_back(container_status(c));
      for (const auto& c : pod.mains) mains.push_back(container_status(c));
      if (!initialized)
        for (auto& m : mains)
          if (!m["state"].contains("waiting") || m["state"]["waiting"].value("reason", "") != "CreateContainerConfigError")
            m["state"] = {{"waiting", {{"reason", "PodInitializing"}}}};
      status = {{"phase", running ? "Running" : "Pending"},
                {"conditions", json::array({condition("Initialized", initialized),
                                            condition("Ready", all_ready, all_ready ? "" : "ContainersNotReady"),
                                            condition("ContainersReady", all_ready, all_ready ? "" : "ContainersNotReady"),
                                            condition("PodScheduled", true)})},
                {"hostIP", "127.0.0.1"},
                {"podIP", "127.0.0.1"},
                {"podIPs", json::array({{{"ip", "127.0.0.1"}}})},
                {"startTime", pod.start_time},
                {"containerStatuses", mains}};
      if (!inits.empty()) status["initContainerStatuses"] = inits;
    }
    if (status == pod.last_status) continue;
    auto written = server_.Mutate("pods", pod.ns, pod.name, [&](json& o) {
      o["status"] = status;
      if (pod.refused_reason != "Unschedulable") o["spec"]["nodeName"] = "local";
    }, true);
    if (written) pod.last_status = status;
    if (written && pod.refused_reason != "Unschedulable" && Str(pod.object["spec"], "nodeName").empty())
      (void)server_.Mutate("pods", pod.ns, pod.name, [&](json& o) { o["spec"]["nodeName"] = "local"; });
  }
}

// ---------------------------------------------------------------------------
// The endpoints controller

void PodRunner::SyncEndpoints() {
  std::vector<json> ready_pods;
  {
    std::lock_guard lock(mu_);
    for (const auto& [uid, pod] : pods_) {
      if (pod->terminating) continue;
      bool ready = !pod->mains.empty();
      for (const auto& c : pod->mains) ready = ready && c.ready;
      if (ready) ready_pods.push_back(pod->object);
    }
  }
  for (const auto& svc : server_.List("services")) {
    const std::string ns = Str(svc["metadata"], "namespace"), name = Str(svc["metadata"], "name");
    const json selector = Obj(svc["spec"], "selector");
    auto external = options_.external_endpoints.find(ns + "/" + name);
    json addresses = json::array(), ports = json::array();
    std::vector<int> target_ports;
    if (external != options_.external_endpoints.end()) {
      addresses.push_back({{"ip", "127.0.0.1"}});
      for (int p : external->second) {
        ports.push_back({{"port", p}, {"protocol", "TCP"}});
        target_ports.push_back(p);
      }
    } else if (!selector.empty()) {
      for (const auto& pod : ready_pods) {
        if (Str(pod["metadata"], "namespace") != ns || !LabelsMatch(selector, Obj(pod["metadata"], "labels"))) continue;
        addresses.push_back({{"ip", "127.0.0.1"},
                             {"nodeName", "local"},
                             {"targetRef", {{"kind", "Pod"}, {"name", Str(pod["metadata"], "name")}, {"namespace", ns},
                                            {"uid", Str(pod["metadata"], "uid")}}}});
        if (!ports.empty()) continue;
        for (const auto& sp : Arr(svc["spec"], "ports")) {
          int target = 0;
          for (const auto& c : Arr(pod["spec"], "containers"))
            if (!target) target = ResolvePort(sp.contains("targetPort") ? sp["targetPort"] : sp["port"], c);
          json port = {{"port", target}, {"protocol", sp.value("protocol", "TCP")}};
          if (!Str(sp, "name").empty()) port["name"] = Str(sp, "name");
          ports.push_back(port);
          target_ports.push_back(target);
        }
      }
    } else {
      continue;  // no selector: its Endpoints are whoever wrote them
    }
    // The webhook calls of the API double go to the first port's pods (one
    // node: every address is 127.0.0.1).
    server_.admission().MapService(ns, name, addresses.empty() || target_ports.empty() ? std::vector<int>{}
                                                                                       : std::vector<int>{target_ports[0]});
    const json subsets = addresses.empty() ? json::array() : json::array({{{"addresses", addresses}, {"ports", ports}}});
    const std::string key = ns + "/" + name;
    if (endpoints_written_[key] == subsets.dump() && server_.Get("endpoints", ns, name)) continue;
    json ep = {{"apiVersion", "v1"},
               {"kind", "Endpoints"},
               {"metadata", {{"name", name}, {"namespace", ns}, {"labels", Obj(svc["metadata"], "labels")}}},
               {"subsets", subsets}};
    bool ok = false;
    if (server_.Get("endpoints", ns, name))
      ok = server_.Mutate("endpoints", ns, name, [&](json& o) { o["subsets"] = subsets; }).has_value();
    else
      ok = server_.Create("endpoints", ep).has_value();
    if (ok) endpoints_written_[key] = subsets.dump();
  }
}

// ---------------------------------------------------------------------------
// kubectl logs

Result<std::string> PodRunner::ReadLog(const std::string& ns, const std::string& pod_name, const std::string& container,
                                       bool previous) {
  std::lock_guard lock(mu_);
  for (const auto& [uid, pod] : pods_) {
    if (pod->ns != ns || pod->name != pod_name || pod->terminating) continue;
    std::vector<std::string> names;
    for (const auto* list : {&pod->inits, &pod->mains})
      for (const auto& c : *list) names.push_back(ContainerName(c));
    std::string which = container;
    if (which.empty()) {
      if (pod->mains.size() != 1)
        return Fail(Error::InvalidArgument("a container name must be specified for pod " + pod_name));
      which = ContainerName(pod->mains[0]);
    }
    if (std::find(names.begin(), names.end(), which) == names.end())
      return Fail(Error::InvalidArgument("container " + which + " is not valid for pod " + pod_name));
    const fs::path log = pod->dir / "logs" / (which + (previous ? ".previous.log" : ".log"));
    std::ifstream in(log, std::ios::binary);
    if (!in) {
      if (previous) return Fail(Error::InvalidArgument("previous terminated container \"" + which + "\" in pod \"" +
                                                       pod_name + "\" not found"));
      return Fail(Error::InvalidArgument("container \"" + which + "\" in pod \"" + pod_name +
                                         "\" is waiting to start: " + (pod->refused.empty() ? "not started" : pod->refused)));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  return Fail(Error::NotFound("pods \"" + pod_name + "\" not found"));
}

}  // namespace moeserve::fakes

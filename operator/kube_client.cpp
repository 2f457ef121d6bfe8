#include "moeserve/operator/kube_client.hpp"

#include "moeserve/common/base64.hpp"
#include "moeserve/common/yaml_limits.hpp"
#include "moeserve/common/yaml_scalar.hpp"

#include <sys/stat.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <cpprest/containerstream.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <cpprest/http_client.h>
#include <yaml-cpp/yaml.h>

namespace moeserve::op {

namespace http = web::http;

namespace resources {
const ResourceRef kMoEDeployment{"moeserve.io", "v1alpha1", "moedeployments", "MoEDeployment", true};
const ResourceRef kQuotaPolicy{"moeserve.io", "v1alpha1", "quotapolicies", "QuotaPolicy", true};
const ResourceRef kConfigMap{"", "v1", "configmaps", "ConfigMap", true};
const ResourceRef kSecret{"", "v1", "secrets", "Secret", true};
const ResourceRef kService{"", "v1", "services", "Service", true};
const ResourceRef kPod{"", "v1", "pods", "Pod", true};
const ResourceRef kPersistentVolume{"", "v1", "persistentvolumes", "PersistentVolume", false};
const ResourceRef kPersistentVolumeClaim{"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true};
const ResourceRef kEvent{"", "v1", "events", "Event", true};
const ResourceRef kNamespace{"", "v1", "namespaces", "Namespace", false};
const ResourceRef kStatefulSet{"apps", "v1", "statefulsets", "StatefulSet", true};
const ResourceRef kPodDisruptionBudget{"policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true};
const ResourceRef kNetworkPolicy{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", true};
const ResourceRef kLease{"coordination.k8s.io", "v1", "leases", "Lease", true};
const ResourceRef kServiceAccount{"", "v1", "serviceaccounts", "ServiceAccount", true};
}  // namespace resources

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}


std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

Error HttpError(int code, const std::string& body, const std::string& what) {
  std::string message = what + ": HTTP " + std::to_string(code);
  json status = json::parse(body, nullptr, false);
  if (status.is_object() && status.contains("message")) message = status.value("message", message);
  switch (code) {
    case 404: return Error::NotFound(message);
    case 409: return Error::Conflict(message);
    case 410: return Error::Unavailable("410 Gone: " + message);
    case 400:
    case 415:
    case 422: return Error::InvalidArgument(message);
    case 401:
    case 403: return Error::PermissionDenied(message);
    default: return Error::Unavailable(message);
  }
}

}  // namespace

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string ResourceRef::Path(const std::string& ns, const std::string& name, const std::string& subresource) const {
  std::string p = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced && !ns.empty()) p += "/namespaces/" + ns;
  p += "/" + plural;
  if (!name.empty()) p += "/" + name;
  if (!subresource.empty()) p += "/" + subresource;
  return p;
}

namespace {

// A kubeconfig is kubectl's format, read with kubectl's meaning: a field that
// is absent, null or "" is unset (kubectl reads YAML into Go structs, where
// null is the zero value). Every value is still checked for its kind before
// use: a map, a list, a number or boolean where text belongs, or
// whitespace-only text is refused naming the field, and null never becomes
// the text "null" (a token "null" sent as a bearer, a namespace "null").
bool Unset(const YAML::Node& n) { return !n || n.IsNull() || (n.IsScalar() && n.Scalar().empty()); }

Result<std::string> OptionalText(const YAML::Node& n, const std::string& path) {
  if (Unset(n)) return "";
  return yaml::Text(n, path);
}

Result<bool> OptionalBoolean(const YAML::Node& n, const std::string& path) {
  if (Unset(n)) return false;
  return yaml::Boolean(n, path);
}

// The entry of `list` (contexts, clusters, users) named `name`, or an
// undefined node when none is.
Result<YAML::Node> Named(const YAML::Node& root, const char* list, const std::string& name, const std::string& file) {
  const YAML::Node items = root[list];
  if (!items || items.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
  if (!items.IsSequence()) {
    return Fail(Error::InvalidArgument(file + ": " + list + ": must be a list, not " + yaml::Describe(items)));
  }
  size_t i = 0;
  for (const auto& item : items) {
    const std::string where = file + ": " + list + "[" + std::to_string(i++) + "]";
    if (!item.IsMap()) return Fail(Error::InvalidArgument(where + ": must be a map, not " + yaml::Describe(item)));
    MOE_ASSIGN_OR_RETURN(const std::string item_name, OptionalText(item["name"], where + ".name"));
    if (item_name == name) return item;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

// The map under an entry's `cluster`, `context` or `user` (an empty one when absent or null).
Result<YAML::Node> Body(const YAML::Node& entry, const char* field, const std::string& where) {
  const YAML::Node body = entry[field];
  if (!body || body.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!body.IsMap()) return Fail(Error::InvalidArgument(where + "." + field + ": must be a map, not " + yaml::Describe(body)));
  return body;
}

Result<KubeConfig> ParseKubeconfig(const YAML::Node& root, const std::string& path) {
  if (!root.IsMap()) return Fail(Error::InvalidArgument(path + ": must be a map (a kubeconfig), not " + yaml::Describe(root)));
  MOE_ASSIGN_OR_RETURN(const std::string current, OptionalText(root["current-context"], path + ": current-context"));
  if (current.empty()) return Fail(Error::InvalidArgument(path + ": current-context is not set"));
  MOE_ASSIGN_OR_RETURN(const YAML::Node context_entry, Named(root, "contexts", current, path));
  if (!context_entry) return Fail(Error::InvalidArgument(path + ": context \"" + current + "\" not found"));
  const std::string cwhere = path + ": contexts[" + current + "]";
  MOE_ASSIGN_OR_RETURN(const YAML::Node context, Body(context_entry, "context", cwhere));
  MOE_ASSIGN_OR_RETURN(const std::string cluster_name, OptionalText(context["cluster"], cwhere + ".context.cluster"));
  MOE_ASSIGN_OR_RETURN(const std::string user_name, OptionalText(context["user"], cwhere + ".context.user"));
  MOE_ASSIGN_OR_RETURN(const std::string ns, OptionalText(context["namespace"], cwhere + ".context.namespace"));
  MOE_ASSIGN_OR_RETURN(const YAML::Node cluster_entry, Named(root, "clusters", cluster_name, path));
  if (cluster_name.empty() || !cluster_entry) {
    return Fail(Error::InvalidArgument(path + ": the current context's cluster is not defined"));
  }
  MOE_ASSIGN_OR_RETURN(const YAML::Node user_entry, Named(root, "users", user_name, path));
  // Relative file paths in a kubeconfig are relative to the file.
  const std::string dir = path.substr(0, path.find_last_of('/') + 1);
  auto resolve = [&](const std::string& p) { return p.empty() || p[0] == '/' ? p : dir + p; };
  KubeConfig c;
  const std::string where = path + ": clusters[" + cluster_name + "].cluster";
  MOE_ASSIGN_OR_RETURN(const YAML::Node cl, Body(cluster_entry, "cluster", path + ": clusters[" + cluster_name + "]"));
  MOE_ASSIGN_OR_RETURN(c.server, OptionalText(cl["server"], where + ".server"));
  MOE_ASSIGN_OR_RETURN(std::string ca_file, OptionalText(cl["certificate-authority"], where + ".certificate-authority"));
  c.ca_file = resolve(ca_file);
  MOE_ASSIGN_OR_RETURN(std::string ca_data, OptionalText(cl["certificate-authority-data"], where + ".certificate-authority-data"));
  c.ca_data = Base64Decode(ca_data);
  MOE_ASSIGN_OR_RETURN(c.insecure_skip_tls_verify,
                       OptionalBoolean(cl["insecure-skip-tls-verify"], where + ".insecure-skip-tls-verify"));
  if (user_entry) {
    const std::string uwhere = path + ": users[" + user_name + "].user";
    MOE_ASSIGN_OR_RETURN(const YAML::Node u, Body(user_entry, "user", path + ": users[" + user_name + "]"));
    MOE_ASSIGN_OR_RETURN(c.token, OptionalText(u["token"], uwhere + ".token"));
    MOE_ASSIGN_OR_RETURN(std::string token_file, OptionalText(u["tokenFile"], uwhere + ".tokenFile"));
    c.token_file = resolve(token_file);
    MOE_ASSIGN_OR_RETURN(std::string cert_file, OptionalText(u["client-certificate"], uwhere + ".client-certificate"));
    c.client_cert_file = resolve(cert_file);
    MOE_ASSIGN_OR_RETURN(std::string key_file, OptionalText(u["client-key"], uwhere + ".client-key"));
    c.client_key_file = resolve(key_file);
    MOE_ASSIGN_OR_RETURN(std::string cert_data, OptionalText(u["client-certificate-data"], uwhere + ".client-certificate-data"));
    c.client_cert_data = Base64Decode(cert_data);
    MOE_ASSIGN_OR_RETURN(std::string key_data, OptionalText(u["client-key-data"], uwhere + ".client-key-data"));
    c.client_key_data = Base64Decode(key_data);
  }
  if (!ns.empty()) c.namespace_name = ns;
  if (c.server.empty()) return Fail(Error::InvalidArgument(path + ": the cluster has no server"));
  return c;
}

}  // namespace

Result<KubeConfig> LoadKubeconfig(const std::string& path_in) {
  std::string path = path_in;
  if (path.empty() && std::getenv("KUBECONFIG")) {
    path = std::getenv("KUBECONFIG");
    if (auto colon = path.find(':'); colon != std::string::npos) path = path.substr(0, colon);
  }
  if (path.empty()) return Fail(Error::InvalidArgument("no kubeconfig given"));
  std::ifstream in(path);
  if (!in) return Fail(Error::Io(path + ": cannot be opened"));
  std::stringstream text;
  text << in.rdbuf();
  // yaml-cpp parses recursively: bound the text before it sees it.
  MOE_TRY(CheckYamlLimits(text.str(), {.max_bytes = 4u << 20, .max_depth = 64}, path));
  try {
    return ParseKubeconfig(YAML::Load(text.str()), path);
  } catch (const std::exception& e) {
    return Fail(Error::InvalidArgument(path + ": " + e.what()));
  }
}

Result<KubeConfig> InClusterConfig(const std::string& secrets_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port) return Fail(Error::NotFound("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set"));
  KubeConfig c;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  std::string scheme = std::getenv("MOESERVE_INCLUSTER_SCHEME") ? std::getenv("MOESERVE_INCLUSTER_SCHEME") : "https";
  c.server = scheme + "://" + h + ":" + port;
  c.token_file = secrets_dir + "/token";
  struct stat st;
  if (::stat(c.token_file.c_str(), &st) != 0) return Fail(Error::NotFound("no service-account token at " + c.token_file));
  if (::stat((secrets_dir + "/ca.crt").c_str(), &st) == 0) c.ca_file = secrets_dir + "/ca.crt";
  std::string ns = Trim(ReadFile(secrets_dir + "/namespace"));
  if (!ns.empty()) c.namespace_name = ns;
  return c;
}

Result<KubeConfig> ResolveKubeConfig(const std::string& flag) {
  if (!flag.empty()) return LoadKubeconfig(flag);
  if (std::getenv("KUBECONFIG")) return LoadKubeconfig("");
  auto in_cluster = InClusterConfig();
  if (in_cluster) return in_cluster;
  if (const char* home = std::getenv("HOME")) {
    std::string p = std::string(home) + "/.kube/config";
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) return LoadKubeconfig(p);
  }
  return Fail(Error::NotFound("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a cluster"));
}

// ---------------------------------------------------------------------------

struct KubeClient::Impl {
  std::unique_ptr<http::client::http_client> client;
  std::unique_ptr<http::client::http_client> watch_client;
  std::mutex cancel_mu;
  pplx::cancellation_token_source cancel;
  std::atomic<bool> cancelled{false};
};

KubeClient::KubeClient(KubeConfig config)
    : config_(std::move(config)),
      timeout_ms_(std::max<int64_t>(1, static_cast<int64_t>(config_.request_timeout_s * 1000))),
      impl_(std::make_unique<Impl>()) {}

KubeClient::~KubeClient() { CancelWatches(); }

Result<std::unique_ptr<KubeClient>> KubeClient::Create(const KubeConfig& config) {
  std::unique_ptr<KubeClient> c(new KubeClient(config));
  auto make = [&](double timeout_s) {
    http::client::http_client_config cfg;
    cfg.set_timeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    cfg.set_validate_certificates(!config.insecure_skip_tls_verify);
    KubeConfig tls = config;
    if (!tls.ca_file.empty()) tls.ca_data = ReadFile(tls.ca_file);
    if (!tls.client_cert_file.empty()) tls.client_cert_data = ReadFile(tls.client_cert_file);
    if (!tls.client_key_file.empty()) tls.client_key_data = ReadFile(tls.client_key_file);
    // Nagle's algorithm holds a request body back until the headers are
    // acknowledged, and the server delays that ACK: 40 ms per write. Off.
    const bool https = config.server.rfind("https://", 0) == 0;
    cfg.set_nativehandle_options([https](http::client::native_handle handle) {
      boost::system::error_code ec;
      if (https) {
        auto* stream = static_cast<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>*>(handle);
        if (stream->lowest_layer().is_open()) stream->lowest_layer().set_option(boost::asio::ip::tcp::no_delay(true), ec);
      } else {
        auto* socket = static_cast<boost::asio::ip::tcp::socket*>(handle);
        if (socket->is_open()) socket->set_option(boost::asio::ip::tcp::no_delay(true), ec);
      }
    });
    if (https) {
      cfg.set_ssl_context_callback([tls](boost::asio::ssl::context& ctx) {
        boost::system::error_code ec;
        if (!tls.ca_data.empty())
          ctx.add_certificate_authority(boost::asio::buffer(tls.ca_data.data(), tls.ca_data.size()), ec);
        if (!tls.client_cert_data.empty())
          ctx.use_certificate_chain(boost::asio::buffer(tls.client_cert_data.data(), tls.client_cert_data.size()), ec);
        if (!tls.client_key_data.empty())
          ctx.use_private_key(boost::asio::buffer(tls.client_key_data.data(), tls.client_key_data.size()),
                              boost::asio::ssl::context::pem, ec);
      });
    }
    return std::make_unique<http::client::http_client>(utility::conversions::to_string_t(config.server), cfg);
  };
  try {
    c->impl_->client = make(config.request_timeout_s);
    // A watch is quiet for long stretches; the server's timeoutSeconds ends it first.
    c->impl_->watch_client = make(3600);
  } catch (const std::exception& e) {
    return Fail(Error::InvalidArgument("kubernetes client for " + config.server + ": " + e.what()));
  }
  return c;
}

std::string KubeClient::BearerToken() {
  std::lock_guard lock(token_mu_);
  if (config_.token_file.empty()) return config_.token;
  struct stat st;
  if (::stat(config_.token_file.c_str(), &st) == 0) {
    int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (mtime != token_mtime_ns_) {
      token_ = Trim(ReadFile(config_.token_file));
      token_mtime_ns_ = mtime;
    }
  }
  return token_;
}

void KubeClient::LimitRequestTimeout(std::chrono::milliseconds timeout) {
  int64_t current = timeout_ms_.load();
  while (timeout.count() > 0 && timeout.count() < current && !timeout_ms_.compare_exchange_weak(current, timeout.count())) {
  }
}

void KubeClient::SetWriteFence(std::shared_ptr<WriteFence> fence, std::string exempt_prefix) {
  std::lock_guard lock(fence_mu_);
  fence_ = std::move(fence);
  fence_exempt_prefix_ = std::move(exempt_prefix);
}

Result<json> KubeClient::Call(const std::string& method, const std::string& path_and_query,
                              const std::string& content_type, const std::string& body,
                              std::chrono::milliseconds timeout) {
  const std::string what = method + " " + path_and_query;
  auto budget = std::chrono::milliseconds(timeout_ms_.load());
  if (timeout.count() > 0) budget = std::min(budget, timeout);
  if (method != "GET") {
    std::shared_ptr<WriteFence> fence;
    {
      std::lock_guard lock(fence_mu_);
      if (fence_ && path_and_query.rfind(fence_exempt_prefix_, 0) != 0) fence = fence_;
    }
    if (fence) {
      const auto left = fence->Remaining();
      if (left.count() <= 0)
        return Fail(Error::Unavailable(what + ": not sent: this replica is not leading (its lease deadline passed)"));
      budget = std::min(budget, left);
    }
  }
  http::http_request req(method);
  req.set_request_uri(path_and_query);
  req.headers().add("Accept", "application/json");
  req.headers().add("User-Agent", config_.user_agent);
  std::string token = BearerToken();
  if (!token.empty()) req.headers().add("Authorization", "Bearer " + token);
  if (!body.empty()) req.set_body(body, content_type);
  // The whole exchange, body included, must end by the deadline: cpprest's
  // own timeout only bounds each wait for bytes, so a server that trickles
  // could hold a call (and a leader's write) far longer.
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    int code = 0;
    std::string text, error;
  };
  auto outcome = std::make_shared<Outcome>();
  pplx::cancellation_token_source cancel;
  try {
    impl_->client->request(req, cancel.get_token())
        .then([](http::http_response resp) {
          const int code = resp.status_code();
          return resp.extract_utf8string(true).then([code](std::string text) { return std::make_pair(code, text); });
        })
        .then([outcome](pplx::task<std::pair<int, std::string>> t) {
          std::lock_guard lock(outcome->mu);
          try {
            auto [code, text] = t.get();
            outcome->code = code;
            outcome->text = std::move(text);
          } catch (const std::exception& e) {
            outcome->error = e.what();
          } catch (...) {
            outcome->error = "request failed";
          }
          outcome->done = true;
          outcome->cv.notify_all();
        });
  } catch (const std::exception& e) {
    return Fail(Error::Unavailable(what + ": " + e.what()));
  }
  std::unique_lock lock(outcome->mu);
  if (!outcome->cv.wait_for(lock, budget, [&] { return outcome->done; })) {
    lock.unlock();
    cancel.cancel();
    return Fail(Error::Timeout(what + ": no complete response within " + std::to_string(budget.count()) + " ms"));
  }
  if (!outcome->error.empty()) return Fail(Error::Unavailable(what + ": " + outcome->error));
  if (outcome->code >= 300) return Fail(HttpError(outcome->code, outcome->text, what));
  json parsed = json::parse(outcome->text, nullptr, false);
  if (parsed.is_discarded()) return Fail(Error::Unavailable(what + ": response is not JSON"));
  return parsed;
}

Result<json> KubeClient::Get(const ResourceRef& r, const std::string& ns, const std::string& name,
                              std::chrono::milliseconds timeout) {
  return Call("GET", r.Path(ns, name), "", "", timeout);
}

Result<json> KubeClient::List(const ResourceRef& r, const std::string& ns, const ListOptions& options) {
  std::string q;
  if (!options.label_selector.empty()) q += "&labelSelector=" + UrlEncode(options.label_selector);
  if (!options.field_selector.empty()) q += "&fieldSelector=" + UrlEncode(options.field_selector);
  if (options.limit > 0) q += "&limit=" + std::to_string(options.limit);
  if (!options.continue_token.empty()) q += "&continue=" + UrlEncode(options.continue_token);
  return Call("GET", r.Path(ns) + (q.empty() ? "" : "?" + q.substr(1)), "", "");
}

Result<json> KubeClient::ListAll(const ResourceRef& r, const std::string& ns, ListOptions options) {
  if (options.limit <= 0) options.limit = 500;
  options.continue_token.clear();
  MOE_ASSIGN_OR_RETURN(json all, List(r, ns, options));
  std::string next = all["metadata"].value("continue", "");
  while (!next.empty()) {
    options.continue_token = next;
    MOE_ASSIGN_OR_RETURN(json page, List(r, ns, options));
    for (auto& item : page["items"]) all["items"].push_back(std::move(item));
    next = page["metadata"].value("continue", "");
  }
  all["metadata"].erase("continue");
  return all;
}

Result<json> KubeClient::Create(const ResourceRef& r, const std::string& ns, const json& object) {
  return Call("POST", r.Path(ns), "application/json", object.dump());
}

Result<json> KubeClient::CreateSubresource(const ResourceRef& r, const std::string& ns, const std::string& name,
                                           const std::string& subresource, const json& body) {
  return Call("POST", r.Path(ns, name, subresource), "application/json", body.dump());
}

Result<json> KubeClient::Update(const ResourceRef& r, const json& object, std::chrono::milliseconds timeout) {
  const json& m = object["metadata"];
  return Call("PUT", r.Path(m.value("namespace", ""), m.value("name", "")), "application/json", object.dump(),
              timeout);
}

Result<json> KubeClient::UpdateStatus(const ResourceRef& r, const json& object) {
  const json& m = object["metadata"];
  return Call("PUT", r.Path(m.value("namespace", ""), m.value("name", ""), "status"), "application/json",
              object.dump());
}

Result<json> KubeClient::Patch(const ResourceRef& r, const std::string& ns, const std::string& name,
                               const std::string& patch_type, const json& patch, const std::string& subresource,
                               const std::string& field_manager, bool force) {
  std::string q;
  if (!field_manager.empty()) q += "&fieldManager=" + UrlEncode(field_manager);
  if (force) q += "&force=true";
  return Call("PATCH", r.Path(ns, name, subresource) + (q.empty() ? "" : "?" + q.substr(1)), patch_type,
              patch.dump());
}

Status KubeClient::Delete(const ResourceRef& r, const std::string& ns, const std::string& name,
                          const std::string& propagation, const Preconditions& preconditions) {
  json options = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", propagation}};
  if (!preconditions.uid.empty()) options["preconditions"]["uid"] = preconditions.uid;
  if (!preconditions.resource_version.empty())
    options["preconditions"]["resourceVersion"] = preconditions.resource_version;
  auto result = Call("DELETE", r.Path(ns, name), "application/json", options.dump());
  if (!result) return Fail(result.error());
  return Ok();
}

void KubeClient::CancelWatches() {
  std::lock_guard lock(impl_->cancel_mu);
  impl_->cancelled = true;
  impl_->cancel.cancel();
}

Result<WatchEnd> KubeClient::Watch(const ResourceRef& r, const std::string& ns, const WatchOptions& options,
                                   const std::function<void(const std::string&, const json&)>& on_event) {
  pplx::cancellation_token token = pplx::cancellation_token::none();
  {
    std::lock_guard lock(impl_->cancel_mu);
    if (impl_->cancelled) return WatchEnd::kCancelled;
    token = impl_->cancel.get_token();
  }
  std::string q = "?watch=true&timeoutSeconds=" + std::to_string(options.timeout_seconds);
  if (options.allow_bookmarks) q += "&allowWatchBookmarks=true";
  if (!options.resource_version.empty()) q += "&resourceVersion=" + UrlEncode(options.resource_version);
  if (!options.label_selector.empty()) q += "&labelSelector=" + UrlEncode(options.label_selector);
  http::http_request req(http::methods::GET);
  req.set_request_uri(r.Path(ns) + q);
  req.headers().add("Accept", "application/json");
  req.headers().add("User-Agent", config_.user_agent);
  std::string bearer = BearerToken();
  if (!bearer.empty()) req.headers().add("Authorization", "Bearer " + bearer);
  const std::string what = "watch " + r.Path(ns);
  try {
    http::http_response resp = impl_->watch_client->request(req, token).get();
    int code = resp.status_code();
    if (code == 410) return WatchEnd::kGone;
    if (code >= 300) return Fail(HttpError(code, resp.extract_utf8string(true).get(), what));
    // One event per line. Read whatever has arrived in bulk, blocking for a
    // single byte only when nothing has: cpprest's read_line costs a task per
    // character, which made watches the operator's hottest path.
    auto buffer = resp.body().streambuf();
    using traits = concurrency::streams::istream::traits;
    std::string pending;
    std::vector<uint8_t> chunk(64 * 1024);
    std::optional<WatchEnd> ended;
    auto drain_lines = [&]() -> Status {
      size_t newline;
      while ((newline = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, newline);
        pending.erase(0, newline + 1);
        json event = json::parse(line, nullptr, false);
        if (event.is_discarded() || !event.is_object()) continue;
        std::string type = event.value("type", "");
        if (type == "ERROR") {
          const json& status = event["object"];
          if (status.value("code", 0) == 410) {
            ended = WatchEnd::kGone;
            return Ok();
          }
          return Fail(Error::Unavailable(what + ": " + status.value("message", "watch error")));
        }
        on_event(type, event["object"]);
        if (impl_->cancelled) {
          ended = WatchEnd::kCancelled;
          return Ok();
        }
      }
      return Ok();
    };
    while (!ended) {
      size_t available = buffer.in_avail();
      if (available == 0) {
        auto c = buffer.bumpc().get();
        if (c == traits::eof()) break;
        pending.push_back(static_cast<char>(c));
      } else {
        size_t n = buffer.getn(chunk.data(), std::min(available, chunk.size())).get();
        pending.append(reinterpret_cast<const char*>(chunk.data()), n);
      }
      MOE_TRY(drain_lines());
    }
    if (ended) return *ended;
    return impl_->cancelled ? WatchEnd::kCancelled : WatchEnd::kClosed;
  } catch (const pplx::task_canceled&) {
    return WatchEnd::kCancelled;
  } catch (const std::exception& e) {
    if (impl_->cancelled) return WatchEnd::kCancelled;
    return Fail(Error::Unavailable(what + ": " + e.what()));
  }
}

}  // namespace moeserve::op

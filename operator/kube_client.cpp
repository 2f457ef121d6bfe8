#include "moeserve/operator/kube_client.hpp"

#include "moeserve/common/base64.hpp"

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

Result<KubeConfig> LoadKubeconfig(const std::string& path_in) {
  std::string path = path_in;
  if (path.empty() && std::getenv("KUBECONFIG")) {
    path = std::getenv("KUBECONFIG");
    if (auto colon = path.find(':'); colon != std::string::npos) path = path.substr(0, colon);
  }
  if (path.empty()) return Fail(Error::InvalidArgument("no kubeconfig given"));
  try {
    YAML::Node root = YAML::LoadFile(path);
    std::string current = root["current-context"].as<std::string>("");
    if (current.empty()) return Fail(Error::InvalidArgument(path + ": current-context is not set"));
    auto find = [&](const char* list, const std::string& name) -> YAML::Node {
      for (const auto& item : root[list])
        if (item["name"].as<std::string>("") == name) return item;
      return YAML::Node();
    };
    YAML::Node context = find("contexts", current);
    if (!context || context.IsNull()) return Fail(Error::InvalidArgument(path + ": context \"" + current + "\" not found"));
    YAML::Node cluster = find("clusters", context["context"]["cluster"].as<std::string>(""));
    if (!cluster || cluster.IsNull()) return Fail(Error::InvalidArgument(path + ": the current context's cluster is not defined"));
    YAML::Node user = find("users", context["context"]["user"].as<std::string>(""));
    // Relative file paths in a kubeconfig are relative to the file.
    std::string dir = path.substr(0, path.find_last_of('/') + 1);
    auto resolve = [&](const std::string& p) { return p.empty() || p[0] == '/' ? p : dir + p; };
    KubeConfig c;
    const YAML::Node cl = cluster["cluster"];
    c.server = cl["server"].as<std::string>("");
    c.ca_file = resolve(cl["certificate-authority"].as<std::string>(""));
    if (cl["certificate-authority-data"]) c.ca_data = Base64Decode(cl["certificate-authority-data"].as<std::string>());
    c.insecure_skip_tls_verify = cl["insecure-skip-tls-verify"].as<bool>(false);
    if (user && !user.IsNull()) {
      const YAML::Node u = user["user"];
      c.token = u["token"].as<std::string>("");
      c.token_file = resolve(u["tokenFile"].as<std::string>(""));
      c.client_cert_file = resolve(u["client-certificate"].as<std::string>(""));
      c.client_key_file = resolve(u["client-key"].as<std::string>(""));
      if (u["client-certificate-data"]) c.client_cert_data = Base64Decode(u["client-certificate-data"].as<std::string>());
      if (u["client-key-data"]) c.client_key_data = Base64Decode(u["client-key-data"].as<std::string>());
    }
    c.namespace_name = context["context"]["namespace"].as<std::string>("default");
    if (c.server.empty()) return Fail(Error::InvalidArgument(path + ": the cluster has no server"));
    return c;
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

#include "moeserve/operator/admission_webhook.hpp"

#include <algorithm>

#include "moeserve/common/base64.hpp"
#include "moeserve/common/log.hpp"

namespace moeserve::op {
namespace {

constexpr char kCaCert[] = "ca.crt";
constexpr char kCaKey[] = "ca.key";
constexpr char kTlsCert[] = "tls.crt";
constexpr char kTlsKey[] = "tls.key";

std::string DataOf(const json& secret, const char* key) {
  const json data = secret.value("data", json::object());
  if (!data.is_object() || !data.contains(key) || !data[key].is_string()) return "";
  return Base64Decode(data[key].get<std::string>());
}

// The certificates of a PEM bundle that have not expired, one PEM block each.
std::vector<std::string> ValidBlocks(const std::string& bundle, std::chrono::system_clock::time_point now) {
  std::vector<std::string> out;
  const std::string end = "-----END CERTIFICATE-----";
  size_t at = 0;
  while (true) {
    const size_t begin = bundle.find("-----BEGIN CERTIFICATE-----", at);
    if (begin == std::string::npos) break;
    const size_t stop = bundle.find(end, begin);
    if (stop == std::string::npos) break;
    std::string block = bundle.substr(begin, stop + end.size() - begin) + "\n";
    at = stop + end.size();
    auto info = ReadCertificate(block);
    if (info && info->not_after > now) out.push_back(block);
  }
  return out;
}

}  // namespace

WebhookController::WebhookController(KubeClient& client, WebhookOptions options, WebhookServer::Handler handler)
    : client_(client), options_(std::move(options)), server_(std::move(handler)) {}

WebhookController::~WebhookController() { Stop(); }

Status WebhookController::Start() {
  MOE_ASSIGN_OR_RETURN(port_, server_.Start(options_.addr));
  log::Info("webhook: listening on port " + std::to_string(port_) + " for " + kWebhookName);
  thread_ = std::thread([this] { Loop(); });
  return Ok();
}

void WebhookController::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  server_.Stop();
}

void WebhookController::SetLeading(bool leading) {
  leading_ = leading;
  cv_.notify_all();  // a new leader patches the bundle at once
}

void WebhookController::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    auto synced = Sync();
    if (!synced) log::Warn("webhook certificates: " + synced.error().ToString());
    lock.lock();
    // Sooner while nothing is served yet, so a replica starts serving soon after the Secret appears.
    const auto wait = server_.CertificatePem().empty()
                          ? std::min(options_.check_interval, std::chrono::milliseconds(500))
                          : options_.check_interval;
    cv_.wait_for(lock, wait);
  }
}

Result<json> WebhookController::EnsureSecret() {
  KubeClient& writer = options_.cert_client ? *options_.cert_client : client_;
  const std::string& ns = options_.operator_namespace;
  auto secret = client_.Get(resources::kSecret, ns, options_.secret);
  if (!secret && secret.error().code() != ErrorCode::kNotFound) return Fail(secret.error());
  if (!options_.manage_certs) {
    if (!secret) return Fail(Error::NotFound("Secret " + ns + "/" + options_.secret + " does not exist yet (certificates are managed outside the operator)"));
    return *secret;
  }
  const auto now = std::chrono::system_clock::now();
  const std::vector<std::string> names = {options_.service + "." + ns + ".svc",
                                          options_.service + "." + ns + ".svc.cluster.local"};
  // What is there, and why it must be replaced (empty: it is good).
  std::string why;
  KeyPair ca{secret ? DataOf(*secret, kCaCert) : "", secret ? DataOf(*secret, kCaKey) : ""};
  const std::string cert = secret ? DataOf(*secret, kTlsCert) : "", key = secret ? DataOf(*secret, kTlsKey) : "";
  bool new_ca = false;
  if (!secret) {
    why = "absent";
    new_ca = true;
  } else {
    auto ca_info = ReadCertificate(ca.cert_pem);
    if (!ca_info || ca.key_pem.empty() || !ca_info->is_ca || RenewalDue(*ca_info, now)) {
      why = "the CA is missing, unreadable or at two thirds of its lifetime";
      new_ca = true;
    } else if (auto pair = VerifyKeyPair(cert, key, ca.cert_pem); !pair) {
      why = pair.error().message();
    } else if (auto info = ReadCertificate(cert); !info) {
      why = "tls.crt: " + info.error().message();
    } else if (RenewalDue(*info, now)) {
      why = "the serving certificate is at two thirds of its lifetime";
    } else {
      for (const auto& n : names)
        if (std::find(info->dns_names.begin(), info->dns_names.end(), n) == info->dns_names.end())
          why = "the serving certificate does not name " + n;
    }
  }
  if (why.empty()) return *secret;

  std::string bundle = ca.cert_pem;
  if (new_ca) {
    const std::string old_bundle = ca.cert_pem;
    MOE_ASSIGN_OR_RETURN(ca, GenerateCa(options_.service + "-ca", options_.cert_lifetime * 10));
    bundle = ca.cert_pem;
    // The old CA stays trusted until it expires: the bundle in the webhook
    // configuration may still be the old one while replicas switch.
    for (const auto& block : ValidBlocks(old_bundle, now)) bundle += block;
  }
  MOE_ASSIGN_OR_RETURN(KeyPair serving, IssueServingCertificate(ca, names, options_.cert_lifetime));
  json data = {{kCaCert, Base64Encode(bundle)},
               {kCaKey, Base64Encode(ca.key_pem)},
               {kTlsCert, Base64Encode(serving.cert_pem)},
               {kTlsKey, Base64Encode(serving.key_pem)}};
  if (!secret) {
    json object = {{"apiVersion", "v1"},
                   {"kind", "Secret"},
                   {"metadata",
                    {{"name", options_.secret},
                     {"namespace", ns},
                     {"labels", {{"app.kubernetes.io/name", "moeserve"}, {"app.kubernetes.io/component", "webhook"}}}}},
                   {"type", "kubernetes.io/tls"},
                   {"data", data}};
    auto created = writer.Create(resources::kSecret, ns, object);
    if (created) {
      log::Info("webhook: created certificates in Secret " + ns + "/" + options_.secret);
      return *created;
    }
    if (created.error().code() != ErrorCode::kConflict) return Fail(created.error());
    // Another replica made it first: serve theirs.
    return client_.Get(resources::kSecret, ns, options_.secret);
  }
  json updated = *secret;
  updated["data"] = data;
  auto written = writer.Update(resources::kSecret, updated);
  if (written) {
    log::Info("webhook: renewed certificates in Secret " + ns + "/" + options_.secret + " (" + why + ")");
    return *written;
  }
  if (written.error().code() != ErrorCode::kConflict) return Fail(written.error());
  return client_.Get(resources::kSecret, ns, options_.secret);  // another replica renewed it
}

Status WebhookController::Sync() {
  // 1. The Secret, made or renewed when we manage it.
  MOE_ASSIGN_OR_RETURN(json secret, EnsureSecret());
  // 2. Serve what it holds.
  const KeyPair pair{DataOf(secret, kTlsCert), DataOf(secret, kTlsKey)};
  if (pair.cert_pem != server_.CertificatePem()) {
    MOE_TRY(server_.SetCertificate(pair));
    log::Info("webhook: serving the certificate from Secret " + options_.operator_namespace + "/" + options_.secret);
  }
  // 3. The leader points the API server at the CA.
  if (options_.manage_certs && leading_) MOE_TRY(PatchCaBundle(DataOf(secret, kCaCert)));
  return Ok();
}

Status WebhookController::PatchCaBundle(const std::string& ca_pem) {
  if (ca_pem.empty()) return Ok();
  auto config = client_.Get(resources::kValidatingWebhookConfiguration, "", options_.config);
  if (!config) return config.error().code() == ErrorCode::kNotFound ? Ok() : Fail(config.error());
  json updated = *config;
  const std::string bundle = Base64Encode(ca_pem);
  bool changed = false;
  if (!updated.value("webhooks", json::array()).is_array()) return Ok();
  for (auto& webhook : updated["webhooks"]) {
    if (!webhook.is_object()) continue;
    json& client_config = webhook["clientConfig"];
    if (!client_config.is_object()) client_config = json::object();
    if (client_config.value("caBundle", json()) == bundle) continue;
    client_config["caBundle"] = bundle;
    changed = true;
  }
  if (!changed) return Ok();
  auto written = client_.Update(resources::kValidatingWebhookConfiguration, updated);
  if (!written) return Fail(written.error());
  log::Info("webhook: wrote the CA bundle into ValidatingWebhookConfiguration " + options_.config);
  return Ok();
}

}  // namespace moeserve::op

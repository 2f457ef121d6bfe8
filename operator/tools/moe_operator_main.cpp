// moe-operator: reconciles MoEDeployments into StatefulSets, Services,
// ConfigMaps, Secrets and PodDisruptionBudgets.
//
//   moe-operator [--kubeconfig PATH] [--namespace NS|all] [--leader-elect]
//                [--leader-election-namespace NS] [--leader-election-id NAME] [--identity ID]
//                [--lease-duration S] [--renew-deadline S] [--retry-period S]
//                [--metrics-addr HOST:PORT|:PORT|0] [--health-addr HOST:PORT|:PORT|0] [--workers N]
//                [--daemon-image IMAGE] [--cache-root DIR] [--shared-cache] [--cache-capacity-gi N]
//                [--run-as-user UID] [--allowed-toleration-keys K,K] [--allowed-node-selector-keys K,K|*]
//                [--allow-affinity=true|false]
//                [--vault-addr URL] [--vault-cacert PATH] [--vault-namespace NS] [--vault-auth-mount MOUNT]
//                [--vault-service-account NAME] [--vault-audience AUD] [--vault-resync-seconds S]
//                [--vault-allow-insecure-http] [--vault-max-answer-bytes N]
//                [--hook-vault-prefix PATH] [--hook-vault-role ROLE]
//                [--operator-namespace NS] [--webhook-addr HOST:PORT|:PORT|0] [--webhook-service NAME]
//                [--webhook-secret NAME] [--webhook-config NAME] [--webhook-manage-certs=true|false]
//                [--webhook-cert-lifetime-seconds S] [--webhook-check-seconds S]
//                [--usage-sync-interval S] [--usage-sync-timeout S]
//                [--autoscale-interval S] [--autoscale-timeout S] [--autoscale-ttft-window S]
//
// The quota webhook (--webhook-addr, default :9443) serves on every replica
// from the Secret --webhook-secret in --operator-namespace (default
// $POD_NAMESPACE, else moeserve-system).
// Vault is on when --vault-addr or VAULT_ADDR is set; VAULT_CACERT and
// VAULT_NAMESPACE are read as Vault's own tools read them, and VAULT_TOKEN
// (development only) replaces the per-namespace Kubernetes login. An
// http:// Vault address is refused at start unless
// --vault-allow-insecure-http (development only) is given.
// Budget hooks' keys are the platform's: Secrets in --operator-namespace, or
// Vault paths under --hook-vault-prefix read as the operator's own role
// --hook-vault-role (hook_secret_source.hpp); no MoEDeployment may name a
// path under that prefix.
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <utility>  // before pplx/threadpool.h, whose boost headers need std::exchange
#include <pplx/threadpool.h>

#include "moeserve/common/log.hpp"
#include "moeserve/common/shutdown_signals.hpp"
#include "moeserve/operator/operator.hpp"
#include "moeserve/operator/vault_integration.hpp"
#include "moeserve/operator/vault_paths.hpp"

namespace {

int Usage(const std::string& why) {
  std::cerr << "moe-operator: " << why << "\n"
            << "usage: moe-operator [--kubeconfig PATH] [--namespace NS|all] [--watch-namespace NS]... [--leader-elect]\n"
               "       [--leader-election-namespace NS] [--leader-election-id NAME] [--identity ID]\n"
               "       [--lease-duration S] [--renew-deadline S] [--retry-period S]\n"
               "       [--metrics-addr HOST:PORT|:PORT|0] [--health-addr HOST:PORT|:PORT|0] [--workers N]\n"
               "       [--daemon-image IMAGE] [--cache-root DIR] [--shared-cache] [--cache-capacity-gi N]\n"
               "       [--cache-storage-class NAME]\n"
               "       [--run-as-user UID] [--allowed-toleration-keys K,K] [--allowed-node-selector-keys K,K|*]\n"
               "       [--allow-affinity=true|false]\n"
               "       [--vault-addr URL] [--vault-cacert PATH] [--vault-namespace NS] [--vault-auth-mount MOUNT]\n"
               "       [--vault-service-account NAME] [--vault-audience AUD] [--vault-resync-seconds S]\n"
               "       [--vault-allow-insecure-http] [--vault-max-answer-bytes N]\n"
               "       [--hook-vault-prefix PATH] [--hook-vault-role ROLE]\n"
               "       [--operator-namespace NS] [--webhook-addr HOST:PORT|:PORT|0] [--webhook-service NAME]\n"
               "       [--webhook-secret NAME] [--webhook-config NAME] [--webhook-manage-certs=true|false]\n"
               "       [--webhook-cert-lifetime-seconds S] [--webhook-check-seconds S]\n"
               "       [--usage-sync-interval S] [--usage-sync-timeout S]\n"
               "       [--autoscale-interval S] [--autoscale-timeout S] [--autoscale-ttft-window S]\n";
  return 2;
}

std::chrono::milliseconds Seconds(const std::string& s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::stod(s) * 1000));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moeserve;
  std::string kubeconfig, ns = "all", election_ns, metrics_addr = ":8080", health_addr = ":8081";
  op::OperatorOptions options;
  op::VaultConfig vault_config = op::VaultConfigFromEnvironment();
  op::VaultAuthOptions vault_auth;
  std::string hook_vault_prefix;
  options.webhook.addr = ":9443";
  if (const char* pod_ns = std::getenv("POD_NAMESPACE"); pod_ns && *pod_ns) options.webhook.operator_namespace = pod_ns;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  options.election.identity = std::string(host) + "_" + std::to_string(getpid());
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      std::string value;
      if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
      } else if (a != "--leader-elect" && a != "--shared-cache" && a != "--vault-allow-insecure-http" &&
                 a != "--allow-affinity" &&
                 a != "--help" && i + 1 < argc) {
        value = argv[++i];
      }
      if (a == "--kubeconfig") kubeconfig = value;
      else if (a == "--namespace") ns = value;
      else if (a == "--watch-namespace") options.watch_namespaces.push_back(value);
      else if (a == "--leader-elect") options.leader_elect = value.empty() || value == "true";
      else if (a == "--leader-election-namespace") election_ns = value;
      else if (a == "--leader-election-id") options.election.lease_name = value;
      else if (a == "--identity") options.election.identity = value;
      else if (a == "--lease-duration") options.election.lease_duration = Seconds(value);
      else if (a == "--renew-deadline") options.election.renew_deadline = Seconds(value);
      else if (a == "--retry-period") options.election.retry_period = Seconds(value);
      else if (a == "--metrics-addr") metrics_addr = value;
      else if (a == "--health-addr") health_addr = value;
      else if (a == "--workers") options.workers = std::stoi(value);
      else if (a == "--watch-timeout") options.informer.watch_timeout_s = std::stoi(value);
      else if (a == "--daemon-image") options.reconciler.platform.daemon_image = value;
      else if (a == "--cache-root") options.reconciler.platform.cache_root = value;
      else if (a == "--shared-cache") options.reconciler.platform.shared_cache = value.empty() || value == "true";
      else if (a == "--cache-capacity-gi") options.reconciler.platform.cache_capacity_gi = std::stoll(value);
      else if (a == "--cache-storage-class") options.reconciler.platform.cache_storage_class = value;
      else if (a == "--run-as-user") options.reconciler.platform.run_as_user = std::stoll(value);
      else if (a == "--allowed-toleration-keys") options.reconciler.platform.scheduling.toleration_keys = op::ParseKeyList(value);
      else if (a == "--allowed-node-selector-keys")
        options.reconciler.platform.scheduling.node_selector_keys = op::ParseKeyList(value);
      else if (a == "--allow-affinity") options.reconciler.platform.scheduling.allow_affinity = value.empty() || value == "true";
      else if (a == "--vault-addr") vault_config.address = value;
      else if (a == "--vault-cacert") vault_config.ca_cert = value;
      else if (a == "--vault-namespace") vault_config.vault_namespace = value;
      else if (a == "--vault-auth-mount") vault_auth.auth_mount = value;
      else if (a == "--vault-service-account") vault_auth.service_account = value;
      else if (a == "--vault-audience") vault_auth.audience = value;
      else if (a == "--vault-resync-seconds") options.reconciler.vault_resync = Seconds(value);
      else if (a == "--vault-allow-insecure-http") vault_config.allow_insecure_http = value.empty() || value == "true";
      else if (a == "--vault-max-answer-bytes") vault_config.max_answer_bytes = std::stoull(value);
      else if (a == "--hook-vault-prefix") hook_vault_prefix = value;
      else if (a == "--hook-vault-role") options.hook_secrets.vault_role = value;
      else if (a == "--operator-namespace") options.webhook.operator_namespace = value;
      else if (a == "--webhook-addr") options.webhook.addr = value;
      else if (a == "--webhook-service") options.webhook.service = value;
      else if (a == "--webhook-secret") options.webhook.secret = value;
      else if (a == "--webhook-config") options.webhook.config = value;
      else if (a == "--webhook-manage-certs") options.webhook.manage_certs = value != "false";
      else if (a == "--webhook-cert-lifetime-seconds") options.webhook.cert_lifetime = std::chrono::seconds(std::stoll(value));
      else if (a == "--webhook-check-seconds") options.webhook.check_interval = Seconds(value);
      else if (a == "--usage-sync-interval") options.usage_sync.interval = Seconds(value);
      else if (a == "--usage-sync-timeout") options.usage_sync.request_timeout = Seconds(value);
      else if (a == "--autoscale-interval") options.autoscaler.interval = Seconds(value);
      else if (a == "--autoscale-timeout") options.autoscaler.request_timeout = Seconds(value);
      else if (a == "--autoscale-ttft-window") options.autoscaler.ttft_window_seconds = Seconds(value).count() / 1000.0;
      else if (a == "--help") return Usage("help");
      else return Usage("unknown flag " + a);
    }
  } catch (const std::exception& e) {
    return Usage(std::string("bad flag value: ") + e.what());
  }
  const auto& platform = options.reconciler.platform;
  if (platform.daemon_image.empty()) return Usage("--daemon-image must name an image");
  if (platform.cache_root.empty() || platform.cache_root[0] != '/') return Usage("--cache-root must be an absolute path");
  if (platform.run_as_user <= 0) return Usage("--run-as-user must be a non-root user id (> 0)");
  if (platform.cache_capacity_gi <= 0) return Usage("--cache-capacity-gi must be positive");
  for (const auto& watched : options.watch_namespaces)
    if (watched.empty() || watched == "all") return Usage("--watch-namespace must name a namespace");
  if (!options.watch_namespaces.empty() && ns != "all")
    return Usage("--watch-namespace and --namespace " + ns + " exclude each other; name the namespaces with --watch-namespace");
  if (options.reconciler.vault_resync.count() <= 0) return Usage("--vault-resync-seconds must be positive");
  if (vault_auth.service_account.empty() || vault_auth.auth_mount.empty())
    return Usage("--vault-service-account and --vault-auth-mount must not be empty");
  if (vault_config.max_answer_bytes < 1024) return Usage("--vault-max-answer-bytes must be at least 1024");
  if (options.hook_secrets.vault_role.empty()) return Usage("--hook-vault-role must not be empty");
  if (!hook_vault_prefix.empty()) {
    auto prefix = op::CanonicalVaultPath(hook_vault_prefix, "--hook-vault-prefix");
    if (!prefix) return Usage(prefix.error().message());
    options.hook_secrets.vault_prefix = *prefix;
  }
  if (options.webhook.cert_lifetime.count() < 3) return Usage("--webhook-cert-lifetime-seconds must be at least 3");
  if (options.webhook.check_interval.count() <= 0) return Usage("--webhook-check-seconds must be positive");
  if (options.leader_elect && options.election.renew_deadline >= options.election.lease_duration)
    return Usage("--renew-deadline must be shorter than --lease-duration");
  // cpprestsdk's pool runs every HTTP continuation; its default of 40
  // threads mostly wakes threads to find nothing to do.
  try {
    crossplat::threadpool::initialize_with_threads(static_cast<size_t>(std::max(4, options.workers + 2)));
  } catch (const std::exception&) {
  }
  auto config = op::ResolveKubeConfig(kubeconfig);
  if (!config) {
    std::cerr << "moe-operator: " << config.error().ToString() << "\n";
    return 1;
  }
  config->user_agent = "moe-operator/" + options.election.identity;
  auto client = op::KubeClient::Create(*config);
  if (!client) {
    std::cerr << "moe-operator: " << client.error().ToString() << "\n";
    return 1;
  }
  options.watch_namespace = ns == "all" ? "" : ns;
  options.election.lease_namespace =
      !election_ns.empty() ? election_ns : (!options.watch_namespace.empty() ? options.watch_namespace : config->namespace_name);
  options.metrics_addr = metrics_addr;
  options.health_addr = health_addr;
  // Vault: `vault:` references are read with each namespace's own login.
  std::unique_ptr<op::VaultIntegration> vault;
  if (!vault_config.address.empty()) {
    if (auto address = op::CheckVaultAddress(vault_config); !address) {
      std::cerr << "moe-operator: " << address.error().message() << "\n";
      return 2;
    }
    if (vault_config.allow_insecure_http && vault_config.address.rfind("https://", 0) != 0)
      log::Warn("moe-operator: --vault-allow-insecure-http: talking to Vault at " + vault_config.address +
                " in plain http (development only)");
    if (const char* token = std::getenv("VAULT_TOKEN"); token && *token) {
      vault_auth.fixed_token = token;
      log::Warn("moe-operator: VAULT_TOKEN is set: every namespace reads Vault with that one token "
                "(development only; unset it to log in per namespace)");
    }
    vault = std::make_unique<op::VaultIntegration>(**client, vault_config, vault_auth);
    options.reconciler.secret_source = vault->secret_source();
    options.reconciler.cleanup = vault->cleanup();
    options.hook_vault = vault->vault_source();
    log::Info("moe-operator: reading vault: references from " + vault_config.address + " (auth mount " +
              vault_auth.auth_mount + ", service account " + vault_auth.service_account + ")");
  }
  // Any replica may create or renew the webhook's certificates (optimistic
  // concurrency picks one), so their writes go through a client without the
  // leader's write fence.
  std::unique_ptr<op::KubeClient> cert_client;
  if (options.leader_elect && options.webhook.manage_certs && op::ListenUri(options.webhook.addr) != "") {
    auto made = op::KubeClient::Create(*config);
    if (!made) {
      std::cerr << "moe-operator: " << made.error().ToString() << "\n";
      return 1;
    }
    cert_client = std::move(*made);
    options.webhook.cert_client = cert_client.get();
  }
  op::Operator oper(**client, options);
  // Operator::RequestStop takes mutexes, which a signal handler must never
  // do: the handler only writes a byte, and this watcher thread stops the
  // operator outside signal context.
  if (auto st = InstallShutdownSignals(); !st) {
    std::cerr << "moe-operator: " << st.error().message() << "\n";
    return 1;
  }
  // A byte other than a signal number (0) wakes the watcher when Run returns
  // on its own (lost leadership), so the thread can always be joined.
  std::thread signal_watcher([&oper] {
    const int sig = WaitForShutdownSignal();
    if (sig == SIGTERM || sig == SIGINT) {
      moeserve::log::Info(std::string("moe-operator: ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") + ", stopping");
      oper.RequestStop();
    }
  });
  log::Info("moe-operator " + options.election.identity + " watching " +
            (!options.watch_namespaces.empty()
                 ? "namespaces " + [&] {
                     std::string names;
                     for (const auto& n : options.watch_namespaces) names += (names.empty() ? "" : ",") + n;
                     return names;
                   }()
                 : options.watch_namespace.empty() ? std::string("all namespaces") : "namespace " + options.watch_namespace) +
            " on " + config->server);
  auto ran = oper.Run();
  WakeShutdownWaiter();
  signal_watcher.join();
  if (!ran) {
    std::cerr << "moe-operator: " << ran.error().ToString() << "\n";
    return 1;
  }
  return 0;
}

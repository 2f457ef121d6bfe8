// moe-fake-vault: the Vault double (fake_vault.hpp) as a process, for the
// demo and for trying the operator's Vault path by hand. Its Kubernetes
// logins are reviewed by the API server at --kube (TokenReview). Prints its
// URL on stdout when it listens.
//
//   moe-fake-vault --kube URL [--port N] [--auth-mount MOUNT] [--config FILE]
//
// FILE (YAML or JSON) holds roles and KV v2 secrets:
//   roles:
//     team-a: {serviceAccounts: [moeserve-vault], namespaces: [team-a],
//              audience: vault, read: ["secret/data/team-a/*"]}
//   kv:
//     - {mount: secret, path: team-a/api-keys, data: {agents: some-key}}
#include <csignal>
#include <iostream>
#include <thread>

#include "fake_vault.hpp"
#include "yaml_json.hpp"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int Usage(const std::string& why) {
  std::cerr << "moe-fake-vault: " << why << "\n"
            << "usage: moe-fake-vault --kube URL [--port N] [--auth-mount MOUNT] [--config FILE]\n";
  return 2;
}

std::vector<std::string> Strings(const nlohmann::json& j, const char* key) {
  std::vector<std::string> out;
  if (j.contains(key) && j[key].is_array())
    for (const auto& s : j[key])
      if (s.is_string()) out.push_back(s);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  std::string kube, mount = "kubernetes", config;
  int port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--kube") kube = v;
    else if (a == "--port") port = std::atoi(v.c_str());
    else if (a == "--auth-mount") mount = v;
    else if (a == "--config") config = v;
    else return Usage("unknown argument " + a);
  }
  if (kube.empty()) return Usage("--kube URL (the API server that reviews service-account tokens) is required");
  moeserve::fakes::FakeVault vault(kube, mount);
  if (!config.empty()) {
    auto docs = moeserve::fakes::LoadYamlFile(config);
    if (!docs || docs->size() != 1 || !(*docs)[0].is_object())
      return Usage(config + ": " + (docs ? "not one mapping" : docs.error().ToString()));
    const nlohmann::json& c = (*docs)[0];
    const nlohmann::json roles = c.value("roles", nlohmann::json::object()), kv = c.value("kv", nlohmann::json::array());
    for (const auto& [name, r] : roles.items()) {
      moeserve::fakes::FakeVaultRole role;
      role.bound_service_account_names = Strings(r, "serviceAccounts");
      role.bound_service_account_namespaces = Strings(r, "namespaces");
      role.audience = r.value("audience", "");
      role.read_paths = Strings(r, "read");
      vault.SetRole(name, role);
    }
    for (const auto& s : kv) {
      std::map<std::string, std::string> data;
      const nlohmann::json values = s.value("data", nlohmann::json::object());
      for (const auto& [k, v] : values.items())
        data[k] = v.is_string() ? v.get<std::string>() : v.dump();
      vault.Put(s.value("mount", "secret"), s.value("path", ""), data);
    }
  }
  if (vault.Start(port) < 0) {
    std::cerr << "moe-fake-vault: cannot listen on 127.0.0.1:" << port << "\n";
    return 1;
  }
  std::cout << vault.url() << std::endl;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  vault.Stop();
  return 0;
}
